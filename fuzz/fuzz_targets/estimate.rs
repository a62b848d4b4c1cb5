//! Arbitrary bytes as an LLM request and as a provider's reply, for each provider: never a
//! panic; an error names a field; a usage read from a reply equals the sum of the figures the
//! reply gives (so a parser that accepted a malformed figure would be caught).

#![no_main]

use libfuzzer_sys::fuzz_target;
use redb_limiter_client::estimate::{Estimate, Provider};
use serde_json::Value;

const PROVIDERS: [Provider; 3] = [Provider::Anthropic, Provider::OpenAi, Provider::Google];

/// The figure at `path` when it is a JSON integer that fits a u64.
fn figure(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().try_fold(v, |v, name| v.get(name))?.as_u64()
}

fuzz_target!(|body: &[u8]| {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    for provider in PROVIDERS {
        let estimate = Estimate::new(provider);
        if let Err(e) = estimate.request_tokens(body) {
            assert!(!e.0.is_empty());
        }
        match estimate.usage_tokens(body) {
            Ok(tokens) => {
                let v = parsed.as_ref().expect("a usage read from valid JSON");
                let expected = match provider {
                    Provider::Anthropic => {
                        ["input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"]
                            .iter()
                            .map(|f| figure(v, &["usage", f]).unwrap_or(0))
                            .sum::<u64>()
                    }
                    Provider::OpenAi => figure(v, &["usage", "total_tokens"]).expect("total_tokens"),
                    Provider::Google => figure(v, &["usageMetadata", "totalTokenCount"]).expect("totalTokenCount"),
                };
                assert_eq!(tokens, expected, "{provider:?} {:?}", String::from_utf8_lossy(body));
            }
            Err(e) => {
                let field = e.0.split(' ').next().unwrap_or_default();
                assert!(
                    ["body", "usage", "usageMetadata"].iter().any(|f| field.starts_with(f)),
                    "{provider:?}: {:?} names no field",
                    e.0
                );
            }
        }
    }
});

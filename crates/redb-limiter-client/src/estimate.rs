//! Tokens of an LLM call: an estimate before it (to acquire with), the real usage after it
//! (to settle with).
//!
//! It owns two readings of a provider's JSON bodies and nothing else (no HTTP, no limiter):
//!
//! - [`Estimate::request_tokens`]: the prompt's characters / 4 (rounded up) plus the most the
//!   reply may hold (`max_tokens` and its equivalents, or a default when the request sets none).
//!   A guess on purpose: the settle after the call corrects it.
//! - [`Estimate::usage_tokens`]: the tokens the provider reports having counted, strictly: a
//!   missing or malformed figure is an error naming it, never a guess. Anthropic: `usage`'s
//!   `input_tokens + output_tokens`, plus `cache_creation_input_tokens` and
//!   `cache_read_input_tokens` when present (they count against its input budgets). OpenAI:
//!   `usage.total_tokens` (Chat Completions and the Responses API), checked against its parts
//!   (`prompt_tokens + completion_tokens`, or `input_tokens + output_tokens`) when they are
//!   given. Google: `usageMetadata.totalTokenCount`.
//! - [`Estimate::usage`] and [`Estimate::request_usage`]: the same figures per kind ([`Usage`]:
//!   input, output, cache reads and cache writes apart), from a reply and from a request (whose
//!   output part is the most the reply may hold, so a settle after the call brings it down to
//!   the real output).
//! - [`Usage::costs`]: a usage as the costs of the buckets a host declares ([`Buckets`]): the
//!   input its provider counts to an input bucket, the output to an output bucket, both to a
//!   tokens bucket. Anthropic counts no cache reads towards its input limits; OpenAI and Google
//!   count cached prompt tokens like any other.
//!
//! ```
//! use redb_limiter_client::estimate::{Estimate, Provider};
//!
//! let estimate = Estimate::new(Provider::Anthropic);
//! let request = br#"{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"Hello there!"}]}"#;
//! assert_eq!(estimate.request_tokens(request)?, 4 + 100); // "user" + "Hello there!": 16 characters
//! let reply = br#"{"usage":{"input_tokens":9,"output_tokens":41,"cache_read_input_tokens":2}}"#;
//! assert_eq!(estimate.usage_tokens(reply)?, 52);
//! # Ok::<(), redb_limiter_client::estimate::EstimateError>(())
//! ```
//!
//! An Anthropic host with input and output token buckets acquires with the request's usage and
//! settles to the reply's:
//!
//! ```
//! use redb_limiter_client::estimate::{Buckets, Estimate, Provider};
//!
//! let estimate = Estimate::new(Provider::Anthropic);
//! let buckets = Buckets::new().input("a/itpm").output("a/otpm");
//! let request = br#"{"max_tokens":256,"messages":[{"role":"user","content":"Hello there!"}]}"#;
//! let before = estimate.request_usage(request)?.costs(Provider::Anthropic, &buckets)?;
//! assert_eq!(before, [("a/itpm".to_owned(), 4), ("a/otpm".to_owned(), 256)]);
//! let reply = br#"{"usage":{"input_tokens":9,"output_tokens":41,"cache_read_input_tokens":2000}}"#;
//! let after = estimate.usage(reply)?.costs(Provider::Anthropic, &buckets)?;
//! assert_eq!(after, [("a/itpm".to_owned(), 9), ("a/otpm".to_owned(), 41)]);
//! # Ok::<(), redb_limiter_client::estimate::EstimateError>(())
//! ```

use serde_json::{Map, Value};

/// Whose request and reply bodies these are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// The Messages API.
    Anthropic,
    /// Chat Completions and the Responses API.
    OpenAi,
    /// The Gemini API (`generateContent`).
    Google,
}

impl std::str::FromStr for Provider {
    type Err = EstimateError;

    /// `anthropic`, `openai` or `google`, as the JavaScript and Python clients name them.
    fn from_str(name: &str) -> Result<Self, EstimateError> {
        match name {
            "anthropic" => Ok(Provider::Anthropic),
            "openai" => Ok(Provider::OpenAi),
            "google" => Ok(Provider::Google),
            _ => Err(EstimateError("provider must be one of anthropic, openai, google".to_owned())),
        }
    }
}

/// A call's tokens per kind, as its provider counts them. `input` holds no cached tokens:
/// the prompt is `input + cache_read + cache_write`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens read neither from nor into a cache.
    pub input: u64,
    /// Reply tokens (reasoning included).
    pub output: u64,
    /// Prompt tokens read from a cache.
    pub cache_read: u64,
    /// Prompt tokens written into a cache (Anthropic's `cache_creation_input_tokens`).
    pub cache_write: u64,
}

/// The buckets a host declares for a provider's tokens, by their keys; each is optional, and
/// at least one is named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Buckets {
    /// Counts the input the provider counts (Anthropic's ITPM).
    pub input: Option<String>,
    /// Counts the output (Anthropic's OTPM).
    pub output: Option<String>,
    /// Counts input and output together (OpenAI's TPM).
    pub tokens: Option<String>,
}

impl Buckets {
    #[must_use]
    pub fn new() -> Self {
        Buckets::default()
    }

    #[must_use]
    pub fn input(mut self, key: impl Into<String>) -> Self {
        self.input = Some(key.into());
        self
    }

    #[must_use]
    pub fn output(mut self, key: impl Into<String>) -> Self {
        self.output = Some(key.into());
        self
    }

    #[must_use]
    pub fn tokens(mut self, key: impl Into<String>) -> Self {
        self.tokens = Some(key.into());
        self
    }
}

/// The wire's bound on a bucket key, in bytes.
const MAX_KEY_BYTES: usize = 512;

impl Usage {
    /// Every token of the call, cached or not.
    pub fn total(&self) -> Result<u64, EstimateError> {
        sum(&[self.input, self.output, self.cache_read, self.cache_write], "usage")
    }

    /// The input that `provider` counts towards its input limits: all of the prompt, but for
    /// Anthropic, whose cache reads count towards none.
    pub fn counted_input(&self, provider: Provider) -> Result<u64, EstimateError> {
        let reads = if provider == Provider::Anthropic { 0 } else { self.cache_read };
        sum(&[self.input, self.cache_write, reads], "usage")
    }

    /// The cost of each bucket named, in the order input, output, tokens: the counted input,
    /// the output, and both. An error names the bucket at fault (none named, a key named
    /// twice, an empty or overlong key).
    pub fn costs(&self, provider: Provider, buckets: &Buckets) -> Result<Vec<(String, u64)>, EstimateError> {
        let input = self.counted_input(provider)?;
        let named = [
            ("input", &buckets.input, input),
            ("output", &buckets.output, self.output),
            ("tokens", &buckets.tokens, sum(&[input, self.output], "usage")?),
        ];
        let mut costs: Vec<(String, u64)> = Vec::new();
        for (i, (name, key, cost)) in named.iter().enumerate() {
            let Some(key) = key else { continue };
            if key.is_empty() || key.len() > MAX_KEY_BYTES {
                let got = key.len();
                return Err(EstimateError(format!(
                    "buckets.{name} must be 1 to {MAX_KEY_BYTES} bytes of UTF-8, got {got}"
                )));
            }
            if let Some((earlier, _, _)) = named[..i].iter().find(|(_, k, _)| k.as_ref() == Some(key)) {
                return Err(EstimateError(format!("buckets.{name} repeats buckets.{earlier}")));
            }
            costs.push((key.clone(), *cost));
        }
        if costs.is_empty() {
            return Err(EstimateError("buckets must name input, output or tokens".to_owned()));
        }
        Ok(costs)
    }
}

/// A count that a larger one holds, and what is left of the larger one.
fn part_of(part: u64, whole: u64, part_field: &str, whole_field: &str) -> Result<u64, EstimateError> {
    whole.checked_sub(part).ok_or_else(|| EstimateError(format!("{part_field} exceeds {whole_field}")))
}

/// Why a body gives no figure. The message names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EstimateError(pub String);

/// Reads token figures from one provider's bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    pub provider: Provider,
    /// What a reply may hold when the request sets no limit on it.
    pub default_max_output: u64,
    /// Characters per token in the guess (4 is the usual rule of thumb).
    pub chars_per_token: u64,
}

/// The fields of a request that hold what the model reads, per provider.
fn prompt_fields(provider: Provider) -> &'static [&'static str] {
    match provider {
        Provider::Anthropic => &["system", "messages", "tools"],
        Provider::OpenAi => &["messages", "input", "instructions", "tools"],
        Provider::Google => &["contents", "systemInstruction", "tools"],
    }
}

/// The characters of every string inside `v`.
fn chars(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.chars().count() as u64,
        Value::Array(items) => items.iter().map(chars).sum(),
        Value::Object(map) => map.values().map(chars).sum(),
        _ => 0,
    }
}

/// A JSON integer from 0 to `u64::MAX` at `obj[name]`, if present; `field` names it in errors.
fn count(obj: &Map<String, Value>, name: &str, field: &str) -> Result<Option<u64>, EstimateError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            n.as_u64().map(Some).ok_or_else(|| EstimateError(format!("{field} must be a non-negative integer")))
        }
        Some(_) => Err(EstimateError(format!("{field} must be a non-negative integer"))),
    }
}

fn required(obj: &Map<String, Value>, name: &str, field: &str) -> Result<u64, EstimateError> {
    count(obj, name, field)?.ok_or_else(|| EstimateError(format!("{field} is required")))
}

fn object<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, EstimateError> {
    v.as_object().ok_or_else(|| EstimateError(format!("{field} must be a JSON object")))
}

fn member<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a Map<String, Value>, EstimateError> {
    object(obj.get(name).ok_or_else(|| EstimateError(format!("{name} is required")))?, name)
}

fn parse(body: &[u8]) -> Result<Value, EstimateError> {
    serde_json::from_slice(body).map_err(|e| EstimateError(format!("body is not valid JSON: {e}")))
}

fn sum(parts: &[u64], field: &str) -> Result<u64, EstimateError> {
    parts.iter().try_fold(0u64, |acc, &p| acc.checked_add(p)).ok_or_else(|| EstimateError(format!("{field} overflows")))
}

impl Estimate {
    /// 4 characters a token, 4096 reply tokens when the request sets no limit.
    #[must_use]
    pub fn new(provider: Provider) -> Self {
        Estimate { provider, default_max_output: 4096, chars_per_token: 4 }
    }

    /// The guess before the call: prompt characters / `chars_per_token` (rounded up) plus the
    /// most the reply may hold.
    pub fn request_tokens(&self, body: &[u8]) -> Result<u64, EstimateError> {
        let usage = self.request_usage(body)?;
        sum(&[usage.input, usage.output], "the estimate")
    }

    /// The guess before the call, per kind: the prompt (characters / `chars_per_token`,
    /// rounded up) as input, and as output the most the reply may hold (`max_tokens` and its
    /// equivalents, or `default_max_output`). It names no cache: a settle to the reply's
    /// [`Estimate::usage`] brings each bucket to what the provider counted.
    pub fn request_usage(&self, body: &[u8]) -> Result<Usage, EstimateError> {
        let value = parse(body)?;
        let obj = object(&value, "body")?;
        let prompt: u64 = prompt_fields(self.provider).iter().filter_map(|f| obj.get(*f)).map(chars).sum();
        let max_output = match self.provider {
            Provider::Anthropic => count(obj, "max_tokens", "max_tokens")?,
            Provider::OpenAi => match count(obj, "max_completion_tokens", "max_completion_tokens")? {
                Some(n) => Some(n),
                None => match count(obj, "max_output_tokens", "max_output_tokens")? {
                    Some(n) => Some(n),
                    None => count(obj, "max_tokens", "max_tokens")?,
                },
            },
            Provider::Google => match obj.get("generationConfig") {
                None => None,
                Some(config) => {
                    count(object(config, "generationConfig")?, "maxOutputTokens", "generationConfig.maxOutputTokens")?
                }
            },
        };
        let input = prompt.div_ceil(self.chars_per_token.max(1));
        Ok(Usage { input, output: max_output.unwrap_or(self.default_max_output), ..Usage::default() })
    }

    /// The provider's usage of the call, per kind, from its reply body, strictly (a missing or
    /// malformed figure is an error naming it). Anthropic: `usage.input_tokens` and
    /// `output_tokens`, `cache_read_input_tokens` and `cache_creation_input_tokens` (0 when
    /// absent). OpenAI: `prompt_tokens` and `completion_tokens` (Chat Completions) or
    /// `input_tokens` and `output_tokens` (the Responses API), their `*_details.cached_tokens`
    /// as cache reads, and `total_tokens`, when given, checked against the two. Google:
    /// `usageMetadata.promptTokenCount` (its `cachedContentTokenCount` as cache reads), and
    /// the rest of `totalTokenCount` (reply and thoughts) as output.
    pub fn usage(&self, body: &[u8]) -> Result<Usage, EstimateError> {
        let value = parse(body)?;
        let obj = object(&value, "body")?;
        match self.provider {
            Provider::Anthropic => {
                let usage = member(obj, "usage")?;
                Ok(Usage {
                    input: required(usage, "input_tokens", "usage.input_tokens")?,
                    output: required(usage, "output_tokens", "usage.output_tokens")?,
                    cache_read: count(usage, "cache_read_input_tokens", "usage.cache_read_input_tokens")?.unwrap_or(0),
                    cache_write: count(usage, "cache_creation_input_tokens", "usage.cache_creation_input_tokens")?
                        .unwrap_or(0),
                })
            }
            Provider::OpenAi => {
                let usage = member(obj, "usage")?;
                let responses = usage.contains_key("input_tokens") || usage.contains_key("output_tokens");
                let (a, b) = if responses { ("input", "output") } else { ("prompt", "completion") };
                let prompt = required(usage, &format!("{a}_tokens"), &format!("usage.{a}_tokens"))?;
                let output = required(usage, &format!("{b}_tokens"), &format!("usage.{b}_tokens"))?;
                let details = format!("{a}_tokens_details");
                let cached = match usage.get(&details) {
                    None | Some(Value::Null) => 0,
                    Some(v) => {
                        let field = format!("usage.{details}");
                        count(object(v, &field)?, "cached_tokens", &format!("{field}.cached_tokens"))?.unwrap_or(0)
                    }
                };
                let input =
                    part_of(cached, prompt, &format!("usage.{details}.cached_tokens"), &format!("usage.{a}_tokens"))?;
                if let Some(total) = count(usage, "total_tokens", "usage.total_tokens")?
                    && prompt.checked_add(output) != Some(total)
                {
                    return Err(EstimateError(format!(
                        "usage.total_tokens is not usage.{a}_tokens + usage.{b}_tokens"
                    )));
                }
                Ok(Usage { input, output, cache_read: cached, cache_write: 0 })
            }
            Provider::Google => {
                let meta = member(obj, "usageMetadata")?;
                let prompt = required(meta, "promptTokenCount", "usageMetadata.promptTokenCount")?;
                let total = required(meta, "totalTokenCount", "usageMetadata.totalTokenCount")?;
                let cached =
                    count(meta, "cachedContentTokenCount", "usageMetadata.cachedContentTokenCount")?.unwrap_or(0);
                let input =
                    part_of(cached, prompt, "usageMetadata.cachedContentTokenCount", "usageMetadata.promptTokenCount")?;
                let output = total.checked_sub(prompt).ok_or_else(|| {
                    EstimateError("usageMetadata.totalTokenCount is below usageMetadata.promptTokenCount".to_owned())
                })?;
                Ok(Usage { input, output, cache_read: cached, cache_write: 0 })
            }
        }
    }

    /// The tokens the provider reports for the call, from its reply body.
    pub fn usage_tokens(&self, body: &[u8]) -> Result<u64, EstimateError> {
        let value = parse(body)?;
        let obj = object(&value, "body")?;
        match self.provider {
            Provider::Anthropic => self.usage(body)?.total(),
            Provider::OpenAi => {
                let usage = member(obj, "usage")?;
                let total = required(usage, "total_tokens", "usage.total_tokens")?;
                for (a, b) in [("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")] {
                    let pa = count(usage, a, &format!("usage.{a}"))?;
                    let pb = count(usage, b, &format!("usage.{b}"))?;
                    if let (Some(pa), Some(pb)) = (pa, pb)
                        && pa.checked_add(pb) != Some(total)
                    {
                        return Err(EstimateError(format!("usage.total_tokens is not usage.{a} + usage.{b}")));
                    }
                }
                Ok(total)
            }
            Provider::Google => {
                required(member(obj, "usageMetadata")?, "totalTokenCount", "usageMetadata.totalTokenCount")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(provider: Provider, body: &str) -> Result<u64, String> {
        Estimate::new(provider).usage_tokens(body.as_bytes()).map_err(|e| e.0)
    }

    fn request(provider: Provider, body: &str) -> Result<u64, String> {
        Estimate::new(provider).request_tokens(body.as_bytes()).map_err(|e| e.0)
    }

    #[test]
    fn anthropic_usage_counts_cache_tokens() {
        use Provider::Anthropic as A;
        let table: &[(&str, Result<u64, &str>)] = &[
            (r#"{"usage":{"input_tokens":10,"output_tokens":5}}"#, Ok(15)),
            (
                r#"{"id":"msg","usage":{"input_tokens":10,"output_tokens":5,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000}}"#,
                Ok(1115),
            ),
            (r#"{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":null}}"#, Ok(15)),
            (r#"{"usage":{"output_tokens":5}}"#, Err("usage.input_tokens is required")),
            (r#"{"usage":{"input_tokens":10}}"#, Err("usage.output_tokens is required")),
            (
                r#"{"usage":{"input_tokens":1.5,"output_tokens":5}}"#,
                Err("usage.input_tokens must be a non-negative integer"),
            ),
            (
                r#"{"usage":{"input_tokens":-1,"output_tokens":5}}"#,
                Err("usage.input_tokens must be a non-negative integer"),
            ),
            (
                r#"{"usage":{"input_tokens":"10","output_tokens":5}}"#,
                Err("usage.input_tokens must be a non-negative integer"),
            ),
            (
                r#"{"usage":{"input_tokens":1,"output_tokens":5,"cache_creation_input_tokens":1e2}}"#,
                Err("usage.cache_creation_input_tokens must be a non-negative integer"),
            ),
            (r#"{"usage":[]}"#, Err("usage must be a JSON object")),
            (r#"{}"#, Err("usage is required")),
            (r#"[]"#, Err("body must be a JSON object")),
            (r#"{"usage":{"input_tokens":18446744073709551615,"output_tokens":1}}"#, Err("usage overflows")),
        ];
        for (body, expected) in table {
            assert_eq!(usage(A, body), expected.map_err(str::to_owned), "{body}");
        }
        assert!(usage(A, "{").unwrap_err().starts_with("body is not valid JSON"));
    }

    #[test]
    fn openai_usage_chat_and_responses() {
        use Provider::OpenAi as O;
        let table: &[(&str, Result<u64, &str>)] = &[
            (r#"{"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}}"#, Ok(29)),
            (
                r#"{"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0}}}"#,
                Ok(29),
            ),
            (
                r#"{"object":"response","usage":{"input_tokens":36,"output_tokens":87,"total_tokens":123,"output_tokens_details":{"reasoning_tokens":0}}}"#,
                Ok(123),
            ),
            (r#"{"usage":{"total_tokens":7}}"#, Ok(7)),
            (
                r#"{"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":30}}"#,
                Err("usage.total_tokens is not usage.prompt_tokens + usage.completion_tokens"),
            ),
            (
                r#"{"usage":{"input_tokens":1,"output_tokens":1,"total_tokens":3}}"#,
                Err("usage.total_tokens is not usage.input_tokens + usage.output_tokens"),
            ),
            (r#"{"usage":{"input_tokens":1,"output_tokens":1}}"#, Err("usage.total_tokens is required")),
            (r#"{"usage":{"total_tokens":true}}"#, Err("usage.total_tokens must be a non-negative integer")),
            (r#"{"choices":[]}"#, Err("usage is required")),
        ];
        for (body, expected) in table {
            assert_eq!(usage(O, body), expected.map_err(str::to_owned), "{body}");
        }
    }

    #[test]
    fn google_usage() {
        use Provider::Google as G;
        let table: &[(&str, Result<u64, &str>)] = &[
            (
                r#"{"candidates":[],"usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":9,"totalTokenCount":13}}"#,
                Ok(13),
            ),
            (r#"{"usageMetadata":{"promptTokenCount":4}}"#, Err("usageMetadata.totalTokenCount is required")),
            (
                r#"{"usageMetadata":{"totalTokenCount":"13"}}"#,
                Err("usageMetadata.totalTokenCount must be a non-negative integer"),
            ),
            (r#"{"usage":{"total_tokens":1}}"#, Err("usageMetadata is required")),
        ];
        for (body, expected) in table {
            assert_eq!(usage(G, body), expected.map_err(str::to_owned), "{body}");
        }
    }

    #[test]
    fn request_estimates_read_the_prompt_and_the_reply_limit() {
        // 40 characters of prompt: 10 tokens.
        let text = "a".repeat(36);
        let anthropic = format!(
            r#"{{"model":"claude","max_tokens":1000,"system":"ab","messages":[{{"role":"u","content":"{text}x"}}]}}"#
        );
        assert_eq!(request(Provider::Anthropic, &anthropic), Ok(10 + 1000));
        let chat = format!(
            r#"{{"model":"gpt","max_completion_tokens":50,"messages":[{{"role":"user","content":"{text}"}}]}}"#
        );
        assert_eq!(request(Provider::OpenAi, &chat), Ok(10 + 50));
        let legacy = format!(r#"{{"model":"gpt","max_tokens":60,"messages":[{{"role":"user","content":"{text}"}}]}}"#);
        assert_eq!(request(Provider::OpenAi, &legacy), Ok(10 + 60));
        let responses = format!(r#"{{"model":"gpt","max_output_tokens":70,"instructions":"abcd","input":"{text}"}}"#);
        assert_eq!(request(Provider::OpenAi, &responses), Ok(10 + 70));
        let google = format!(
            r#"{{"contents":[{{"role":"user","parts":[{{"text":"{text}"}}]}}],"generationConfig":{{"maxOutputTokens":80}}}}"#
        );
        assert_eq!(request(Provider::Google, &google), Ok(10 + 80));
        // No reply limit: the default; characters, not bytes.
        assert_eq!(request(Provider::Google, r#"{"contents":[{"parts":[{"text":"ééé"}]}]}"#), Ok(1 + 4096));
        assert_eq!(
            request(Provider::OpenAi, r#"{"messages":[],"max_tokens":-1}"#),
            Err("max_tokens must be a non-negative integer".into())
        );
        assert_eq!(
            request(Provider::Google, r#"{"generationConfig":{"maxOutputTokens":"8"}}"#),
            Err("generationConfig.maxOutputTokens must be a non-negative integer".into())
        );
        assert_eq!(
            request(Provider::Google, r#"{"generationConfig":[]}"#),
            Err("generationConfig must be a JSON object".into())
        );
        assert_eq!(request(Provider::Anthropic, "5"), Err("body must be a JSON object".into()));
    }
}

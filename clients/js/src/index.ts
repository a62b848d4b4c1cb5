// redb-limiter's host side in TypeScript: the client of the limiter slot's wire, its waiting
// acquire and permits, providers' signals, token estimates, and the adapters (VernLLM, node
// limiter's shape). Zero runtime dependencies: `node:http` (or a `fetch` passed in).

export {
  LimiterClient,
  type AcquireOptions,
  type Adapt,
  type AcquireReply,
  type AcquireRequest,
  type Granted,
  type Limit,
  type LimitFigures,
  type LimiterClientOptions,
  type Outcome,
  type PeekReply,
  type Refused,
  type ResponseLike,
  type WaitReply,
  type WaitReport,
  type Woken,
} from './client.js';
export { Permit, type Costs } from './permit.js';
export {
  ApiError,
  BadRequestError,
  ConnectionError,
  InvalidArgumentError,
  LimitedError,
  LimiterError,
  NotFoundError,
  ProtocolError,
  QueueFullError,
  UnauthorizedError,
  UnavailableError,
  type NoTicket,
  type Reason,
} from './errors.js';
export { MAX_WAIT_MS, MIN_WAIT_MS, vendorBudget, vendorOutcome, vendorWaitMs, type HeadersLike, type Instant } from './vendor.js';
export {
  estimateTokens,
  requestUsage,
  tokenUsage,
  usageCosts,
  usageTokens,
  type MessageLike,
  type Provider,
  type Tokenizer,
  type Usage,
  type UsageBuckets,
} from './estimate.js';
export {
  vernRateLimit,
  VernRateLimitError,
  type VernAcquireResult,
  type VernAimdOptions,
  type VernErrorType,
  type VernLLMClientLike,
  type VernLLMErrorClass,
  type VernLogger,
  type VernRateLimit,
  type VernRateLimitCode,
  type VernRateLimitHint,
  type VernRateLimitOptions,
  type VernRateLimitState,
  type VernWaitReason,
  type VernWireRequest,
} from './vern.js';
export { RateLimiter, TokenBucket, UNITS_PER_TOKEN, type Interval, type RateLimiterOptions, type TokenBucketOptions } from './limiter.js';
export {
  findServerBinary,
  startServer,
  serverPackage,
  serverBinaryName,
  currentPlatform,
  ServerNotFoundError,
  SERVER_BIN_ENV,
  SERVER_PLATFORMS,
  type LocalServer,
  type ServerPlatform,
  type StartServerOptions,
} from './server.js';

// The CommonJS condition's types: `require('redb-limiter')` resolves to index.d.cts.
import limiter = require('redb-limiter');

const client: limiter.LimiterClient = new limiter.LimiterClient({ url: 'http://127.0.0.1:7411' });
export const wait: number = limiter.vendorWaitMs({ 'retry-after': '3' });
export const reply: Promise<limiter.AcquireReply> = client.tryAcquire({ key: 'k', limits: [] });

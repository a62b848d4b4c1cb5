// How the client's requests reach the limiter. By default Node's own `http` (or `https`) module
// with a keep-alive agent per client: a request through it costs about a third of the CPU of one
// through the global `fetch` (undici's web streams and the garbage they leave), and on a busy
// host a waiting call's cost is mostly its requests. A `fetch` the host passes is used instead
// (a proxy, a test, instrumentation).

import { Agent as HttpAgent, type IncomingMessage, request as httpRequest } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';

/** What the client reads of an answer. */
export interface Answer {
  status: number;
  /** The body, as text. */
  text: string;
  /** The `Date` header, when there is one. */
  date: string | null;
}

/** Sends one request; rejects when `signal` aborts, with its reason. */
export type Send = (
  method: 'GET' | 'POST',
  url: string,
  headers: Record<string, string>,
  body: string | undefined,
  signal: AbortSignal,
) => Promise<Answer>;

/** Requests through a `fetch`. */
export function viaFetch(f: typeof fetch): Send {
  return async (method, url, headers, body, signal) => {
    const res = await f(url, { method, headers, body, signal });
    const text = await res.text();
    return { status: res.status, text, date: res.headers.get('date') };
  };
}

/**
 * Requests through `node:http` (or `node:https` for an `https:` URL) over connections kept open
 * between requests. Idle connections do not keep the process alive.
 */
export function viaNodeHttp(secure: boolean): Send {
  const agent = secure ? new HttpsAgent({ keepAlive: true }) : new HttpAgent({ keepAlive: true });
  const request = secure ? httpsRequest : httpRequest;
  return (method, url, headers, body, signal) =>
    new Promise<Answer>((resolve, reject) => {
      if (signal.aborted) {
        reject(signal.reason);
        return;
      }
      const sent = body === undefined ? headers : { ...headers, 'content-length': String(Buffer.byteLength(body)) };
      const fail = (e: unknown) => {
        signal.removeEventListener('abort', abort);
        reject(e);
      };
      const req = request(url, { method, headers: sent, agent }, (res: IncomingMessage) => {
        const chunks: string[] = [];
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => chunks.push(chunk));
        res.on('error', fail);
        res.on('close', () => {
          if (!res.complete) fail(new Error('the connection closed before the whole answer came'));
        });
        res.on('end', () => {
          signal.removeEventListener('abort', abort);
          const date = res.headers.date;
          resolve({ status: res.statusCode ?? 0, text: chunks.join(''), date: date ?? null });
        });
      });
      // An abort closes the connection (whatever was sent may still be decided: the caller undoes it).
      const abort = () => {
        req.destroy();
        reject(signal.reason);
      };
      signal.addEventListener('abort', abort, { once: true });
      req.on('error', fail);
      req.end(body);
    });
}

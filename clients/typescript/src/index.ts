// A client of loopd's HTTP API (docs/http.md): no runtime dependencies, only `fetch`.
//
// Every send carries an idempotency key (the caller's, else one made up here before the
// first attempt), so a send retried after a lost answer, a dropped connection or a
// `503`/`504` is applied once and answered with the first answer. A stream that loses
// its connection reconnects with `Last-Event-ID` and goes on without a gap or a
// duplicate.

import { SseParser, type SseEvent } from "./sse.js";

export { SseParser, type SseEvent } from "./sse.js";

/** A session's status row, as `loopd status` shows it. */
export interface StatusRow {
  session: string;
  state: string;
  pid: number | null;
  epoch: number;
  records: number;
  restarts: number;
  last_error: string | null;
  [field: string]: unknown;
}

/** The answer to a send. `duplicate` is true when the key had been applied already. */
export interface Reply {
  duplicate: boolean;
  key: string;
  text: string;
  epoch: number;
  [field: string]: unknown;
}

/** One record of a session's log (docs/format.md), as `loopd tail` reads it. */
export interface LogRecord {
  type: string;
  time: string;
  [field: string]: unknown;
}

/** A page of records: read on while `next < lines`, then in the next epoch if `current` moved. */
export interface RecordsPage {
  epoch: number;
  current: number;
  since: number;
  records: LogRecord[];
  next: number;
  lines: number;
}

/** An event of a streamed send; the last one is a `reply` (an error is thrown instead). */
export type StreamEvent =
  | { type: "partial"; id: number; text: string }
  | { type: "restart"; id: number; restarts: number; why: string }
  | { type: "gap"; dropped: number }
  | { type: "reply"; id: number; reply: Reply };

/** An error loopd answered (`code` is the wire protocol's), or a call that could not be made. */
export class LoopdError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly status: number,
  ) {
    super(`${code}: ${message}`);
    this.name = "LoopdError";
  }

  /** Whether the same call, with the same key, may be made again. */
  get retryable(): boolean {
    return RETRYABLE.has(this.code) || this.status === 503 || this.status === 504;
  }
}

const RETRYABLE = new Set([
  "busy",
  "unavailable",
  "no_daemon",
  "worker_died",
  "closed",
  "not_owner",
  "timeout",
  "connection",
]);

export interface ClientOptions {
  /** Attempts after the first one for a call that failed in a way a retry can fix (default 5). */
  retries?: number;
  /** The first pause between two attempts, doubled each time up to 2 s (default 100 ms). */
  backoffMs?: number;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
}

export interface SendOptions {
  /** The request's idempotency key (default: a random UUID, kept for every retry). */
  key?: string;
  /** The text comes from outside the App's trust (see docs/apps.md). */
  untrusted?: boolean;
  /** Gives up (an `AbortError`) when this signal aborts. */
  signal?: AbortSignal;
}

export interface StreamOptions extends SendOptions {
  /** Called before each reconnect, with the id of the last event read (0: none yet). */
  onReconnect?: (lastEventId: number) => void;
}

export class LoopdClient {
  private readonly base: string;
  private readonly retries: number;
  private readonly backoffMs: number;
  private readonly fetcher: typeof fetch;

  /** `baseUrl` is where `loopd serve --http` listens, e.g. `http://127.0.0.1:8080`. */
  constructor(baseUrl: string, options: ClientOptions = {}) {
    this.base = baseUrl.replace(/\/+$/, "");
    this.retries = options.retries ?? 5;
    this.backoffMs = options.backoffMs ?? 100;
    this.fetcher = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** Create a session (hosting `app`, a named App of the home's loopd.toml, if given). */
  async createSession(id: string, app?: string): Promise<StatusRow> {
    const body = app === undefined ? { id } : { id, app };
    return (await this.json("POST", "/v1/sessions", { body, retry: false })) as StatusRow;
  }

  /** A session's status row. */
  async status(id: string): Promise<StatusRow> {
    return (await this.json("GET", `/v1/sessions/${enc(id)}`, {})) as StatusRow;
  }

  /** Send a request and wait for its reply; retried by key until answered or out of retries. */
  async send(id: string, text: string, options: SendOptions = {}): Promise<Reply> {
    const key = options.key ?? globalThis.crypto.randomUUID();
    const body = options.untrusted === undefined ? { text } : { text, untrusted: options.untrusted };
    const headers = { "Idempotency-Key": key };
    const signal = options.signal;
    const path = `/v1/sessions/${enc(id)}/requests`;
    const call = signal === undefined ? { body, headers } : { body, headers, signal };
    return (await this.json("POST", path, call)) as Reply;
  }

  /** One page of a session's records (`epoch` default: the current one). */
  async records(
    id: string,
    options: { since?: number; limit?: number; epoch?: number } = {},
  ): Promise<RecordsPage> {
    const query = new URLSearchParams();
    if (options.since !== undefined) query.set("since", String(options.since));
    if (options.limit !== undefined) query.set("limit", String(options.limit));
    if (options.epoch !== undefined) query.set("epoch", String(options.epoch));
    const path = `/v1/sessions/${enc(id)}/records?${query.toString()}`;
    return (await this.json("GET", path, {})) as RecordsPage;
  }

  /** Every record from `epoch` (default 0: the whole history) to the newest, page by page. */
  async *allRecords(
    id: string,
    options: { epoch?: number; pageSize?: number } = {},
  ): AsyncGenerator<LogRecord> {
    let epoch = options.epoch ?? 0;
    let since = 0;
    for (;;) {
      const limit = options.pageSize ?? 1000;
      const page = await this.records(id, { since, epoch, limit });
      yield* page.records;
      if (page.next < page.lines) {
        since = page.next;
      } else if (page.current > page.epoch) {
        epoch = page.epoch + 1;
        since = 0;
      } else {
        return;
      }
    }
  }

  /**
   * Send a request and stream its events: the App's partials, then the reply. A dropped
   * connection (or a retryable error) is followed by the same request with the same key
   * and `Last-Event-ID`: the stream goes on from the next event, without a gap or a
   * duplicate, or ends with the reply from the log if the turn finished meanwhile.
   */
  async *stream(id: string, text: string, options: StreamOptions = {}): AsyncGenerator<StreamEvent> {
    const key = options.key ?? globalThis.crypto.randomUUID();
    const body = JSON.stringify(
      options.untrusted === undefined ? { text } : { text, untrusted: options.untrusted },
    );
    let lastId = 0;
    let failures = 0;
    for (;;) {
      const headers: Record<string, string> = {
        "Content-Type": "application/json",
        Accept: "text/event-stream",
        "Idempotency-Key": key,
      };
      if (lastId > 0) headers["Last-Event-ID"] = String(lastId);
      let failure: LoopdError;
      try {
        const init: RequestInit = { method: "POST", headers, body };
        if (options.signal !== undefined) init.signal = options.signal;
        const response = await this.fetcher(`${this.base}/v1/sessions/${enc(id)}/requests`, init);
        if (!response.ok) throw await errorOf(response);
        const parser = new SseParser();
        const reader = response.body!.getReader();
        for (;;) {
          const { done, value } = await reader.read();
          const events = done ? parser.end() : parser.push(value);
          for (const raw of events) {
            const event = decodeEvent(raw);
            if (event === undefined) continue;
            if ("id" in event) {
              if (event.id <= lastId) continue; // already read before a reconnect
              lastId = event.id;
            }
            failures = 0; // progress: the retries count again from here
            yield event;
            if (event.type === "reply") return;
          }
          if (done) break;
        }
        failure = new LoopdError("connection", "the stream ended before its reply", 0);
      } catch (error) {
        failure = asLoopdError(error);
      }
      if (!failure.retryable || failures >= this.retries) throw failure;
      await pause(this.backoffMs, failures, options.signal);
      failures += 1;
      options.onReconnect?.(lastId);
    }
  }

  private async json(
    method: string,
    path: string,
    call: { body?: object; headers?: Record<string, string>; signal?: AbortSignal; retry?: boolean },
  ): Promise<unknown> {
    const headers: Record<string, string> = { ...call.headers };
    const init: RequestInit = { method, headers };
    if (call.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(call.body);
    }
    if (call.signal !== undefined) init.signal = call.signal;
    const attempts = call.retry === false ? 0 : this.retries;
    for (let failures = 0; ; failures++) {
      let failure: LoopdError;
      try {
        const response = await this.fetcher(this.base + path, init);
        if (response.ok) return await response.json();
        failure = await errorOf(response);
      } catch (error) {
        failure = asLoopdError(error);
      }
      if (!failure.retryable || failures >= attempts) throw failure;
      await pause(this.backoffMs, failures, call.signal);
    }
  }
}

function enc(id: string): string {
  return encodeURIComponent(id);
}

async function errorOf(response: Response): Promise<LoopdError> {
  const text = await response.text();
  try {
    const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
    const { code, message } = parsed.error ?? {};
    if (typeof code === "string" && typeof message === "string") {
      return new LoopdError(code, message, response.status);
    }
  } catch {
    // not loopd's error object: a proxy's page, say
  }
  return new LoopdError(`http_${response.status}`, text.slice(0, 200), response.status);
}

function asLoopdError(error: unknown): LoopdError {
  if (error instanceof LoopdError) return error;
  if (error instanceof Error && error.name === "AbortError") throw error; // the caller's own
  const why = error instanceof Error ? error.message : String(error);
  return new LoopdError("connection", `the call could not be made or was cut off: ${why}`, 0);
}

function decodeEvent(raw: SseEvent): StreamEvent | undefined {
  const data = raw.data === "" ? {} : (JSON.parse(raw.data) as Record<string, unknown>);
  const id = raw.id === undefined ? undefined : Number(raw.id);
  switch (raw.event) {
    case "partial":
      return { type: "partial", id: id ?? 0, text: String(data.text) };
    case "restart":
      return { type: "restart", id: id ?? 0, restarts: Number(data.restarts), why: String(data.why) };
    case "gap":
      return { type: "gap", dropped: Number(data.dropped) };
    case "reply":
      return { type: "reply", id: id ?? 0, reply: data as unknown as Reply };
    case "error": {
      const error = (data.error ?? {}) as { code?: unknown; message?: unknown };
      throw new LoopdError(String(error.code), String(error.message), 200);
    }
    default:
      return undefined; // an event type this client does not know: skipped
  }
}

function pause(backoffMs: number, failures: number, signal?: AbortSignal): Promise<void> {
  const ms = Math.min(2000, backoffMs * 2 ** failures) * (0.5 + Math.random() / 2);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    });
  });
}

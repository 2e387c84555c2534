// The client against a real `loopd serve --http` (tests.apps.http_apps:SlowStreamApp streams
// each word of a request as a partial, 0.15 s apart, then answers as the default App).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { LoopdClient, LoopdError, SseParser, type StreamEvent } from "../src/index.js";
import { CuttingProxy, Serve } from "./harness.js";

let serve: Serve;

before(async () => {
  serve = await Serve.start();
});

after(async () => {
  await serve?.stop();
});

async function usersWithKey(client: LoopdClient, session: string, key: string): Promise<number> {
  let count = 0;
  for await (const record of client.allRecords(session)) {
    if (record.type === "User" && record.key === key) count += 1;
  }
  return count;
}

test("a send retried with its key is applied once and answered with the first answer", async () => {
  const client = new LoopdClient(serve.url);
  await client.createSession("ts-send");
  const first = await client.send("ts-send", "hello there", { key: "order-7" });
  const again = await client.send("ts-send", "hello there", { key: "order-7" });
  assert.equal(first.duplicate, false);
  assert.equal(again.duplicate, true);
  assert.equal(again.key, "order-7");
  assert.equal(again.text, first.text);
  assert.equal(await usersWithKey(client, "ts-send", "order-7"), 1);
});

test("a send without a key gets one made up before its first attempt", async () => {
  const client = new LoopdClient(serve.url);
  await client.createSession("ts-auto");
  const reply = await client.send("ts-auto", "no key given");
  assert.match(reply.key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$/);
  assert.equal(reply.duplicate, false);
});

test("a send whose answer is lost is retried with the same key and applied once", async () => {
  // The first connection's answer never reaches the client: the request was applied,
  // the client saw the connection cut. Its retry must carry the same key.
  const proxy = await CuttingProxy.start(serve.url, (n, received) => n === 0 && received !== "");
  try {
    const direct = new LoopdClient(serve.url);
    await direct.createSession("ts-lost");
    const client = new LoopdClient(proxy.url, { backoffMs: 20 });
    const reply = await client.send("ts-lost", "lost answer");
    assert.equal(proxy.connections, 2, "one cut connection, then the retry");
    assert.equal(reply.duplicate, true, "the retry is answered with the first answer");
    assert.equal(await usersWithKey(direct, "ts-lost", reply.key), 1);
  } finally {
    await proxy.stop();
  }
});

test("a stream cut mid-turn reconnects with Last-Event-ID: no gap, no duplicate", async () => {
  const words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"];
  // The stream's first connection is cut when the server sends its third event.
  let cut = false;
  const proxy = await CuttingProxy.start(serve.url, (_n, received) => {
    cut ||= (received.match(/^id: /gm)?.length ?? 0) >= 3;
    return cut && !reconnects.length;
  });
  const reconnects: number[] = [];
  try {
    await new LoopdClient(serve.url).createSession("ts-stream");
    const client = new LoopdClient(proxy.url, { backoffMs: 20 });
    const events: StreamEvent[] = [];
    const stream = client.stream("ts-stream", words.join(" "), {
      key: "poem-1",
      onReconnect: (last) => reconnects.push(last),
    });
    for await (const event of stream) events.push(event);
    assert.equal(reconnects.length, 1, `reconnects: ${JSON.stringify(reconnects)}`);
    assert.ok(reconnects[0]! >= 1 && reconnects[0]! < words.length, "cut mid-turn");
    const resumed = proxy.sent.find((request) => /^last-event-id:/im.test(request));
    assert.match(resumed ?? "(none)", new RegExp(`^last-event-id: ${reconnects[0]}\\r$`, "im"));
    const partials = events.filter((e) => e.type === "partial");
    assert.deepEqual(
      partials.map((e) => e.text),
      words.map((w, i) => `${i}:${w}`),
    );
    assert.deepEqual(
      events.map((e) => ("id" in e ? e.id : -1)),
      Array.from({ length: words.length + 1 }, (_, i) => i + 1),
    );
    const last = events.at(-1)!;
    assert.equal(last.type, "reply");
    assert.equal(last.type === "reply" && last.reply.key, "poem-1");
    assert.equal(await usersWithKey(client, "ts-stream", "poem-1"), 1);
  } finally {
    await proxy.stop();
  }
});

test("a stream of a finished turn's key ends with the reply from the log", async () => {
  const client = new LoopdClient(serve.url);
  await client.createSession("ts-done");
  const sent = await client.send("ts-done", "one two", { key: "done-1" });
  const events: StreamEvent[] = [];
  for await (const event of client.stream("ts-done", "one two", { key: "done-1" })) {
    events.push(event);
  }
  const last = events.at(-1)!;
  assert.equal(last.type, "reply");
  assert.equal(last.type === "reply" && last.reply.duplicate, true);
  assert.equal(last.type === "reply" && last.reply.text, sent.text);
});

test("errors carry loopd's code and say whether a retry can help", async () => {
  const client = new LoopdClient(serve.url, { retries: 0 });
  await assert.rejects(client.status("ts-nobody"), (error: unknown) => {
    assert.ok(error instanceof LoopdError);
    assert.equal(error.code, "not_found");
    assert.equal(error.status, 404);
    assert.equal(error.retryable, false);
    return true;
  });
  await client.createSession("ts-twice");
  await assert.rejects(client.createSession("ts-twice"), (error: unknown) => {
    assert.ok(error instanceof LoopdError);
    assert.equal(error.code, "exists");
    assert.equal(error.status, 409);
    return true;
  });
});

test("the event-stream parser takes any line ending and any split", () => {
  const text = "id: 1\r\nevent: partial\r\ndata: {\"text\": \"a\"}\r\n\r\n: keep-alive\n\nid: 2\rdata: x\r\r";
  const bytes = new TextEncoder().encode(text);
  for (let split = 0; split <= bytes.length; split++) {
    const parser = new SseParser();
    const events = [...parser.push(bytes.slice(0, split)), ...parser.push(bytes.slice(split))];
    assert.deepEqual(events, [
      { id: "1", event: "partial", data: '{"text": "a"}' },
      { id: "2", event: "message", data: "x" },
    ]);
  }
});

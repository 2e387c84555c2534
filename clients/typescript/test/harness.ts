// A real `loopd serve --http` for the tests, and a TCP proxy in front of it that can cut
// a connection where a test says (an answer lost, a stream dropped mid-turn).

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, closeSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

// dist/test/harness.js -> the repository's root, where `tests.apps.http_apps` imports from.
const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

/** Poll `check` until it returns true or `seconds` pass (then fail saying `what`). */
export async function pollUntil(
  check: () => Promise<boolean>,
  what: string,
  seconds = 60,
): Promise<void> {
  const deadline = Date.now() + seconds * 1000;
  let pause = 10;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${seconds} s waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, pause));
    pause = Math.min(pause * 2, 200);
  }
}

export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** `loopd serve` (the `LOOPD` command, default `loopd` on the PATH) with an HTTP port. */
export class Serve {
  private constructor(
    readonly url: string,
    readonly home: string,
    private readonly proc: ChildProcess,
    private readonly log: string,
  ) {}

  static async start(app = "tests.apps.http_apps:SlowStreamApp"): Promise<Serve> {
    const root = mkdtempSync(path.join(tmpdir(), "loopd-ts-"));
    const home = path.join(root, "home");
    const port = await freePort();
    const log = path.join(root, "serve.log");
    const out = openSync(log, "a");
    const command = process.env.LOOPD ?? "loopd";
    const args = ["serve", "--home", home, "--http", `127.0.0.1:${port}`, "--app", app];
    const proc = spawn(command, args, { cwd: REPO, stdio: ["ignore", out, out] });
    closeSync(out);
    const serve = new Serve(`http://127.0.0.1:${port}`, home, proc, log);
    await pollUntil(async () => {
      if (proc.exitCode !== null) {
        throw new Error(`loopd serve exited with ${proc.exitCode}: ${readFileSync(log, "utf8")}`);
      }
      try {
        // Serve's port listens only once its daemon's control socket does: any answer
        // means a call would reach the daemon.
        return (await fetch(`${serve.url}/v1/openapi.json`)).ok;
      } catch {
        return false;
      }
    }, "loopd serve to answer on its HTTP port");
    return serve;
  }

  /** SIGTERM (serve stops its workers), a deadline, then SIGKILL. */
  async stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => this.proc.once("exit", () => resolve()));
    this.proc.kill("SIGTERM");
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 20_000);
    await exited;
    clearTimeout(timer);
  }

  logText(): string {
    return readFileSync(this.log, "utf8");
  }
}

/**
 * A TCP proxy to `target`. For each connection, `cut(n, received)` is asked after each
 * chunk from the server (n: the connection's number from 0, received: all its server
 * bytes so far as text); when it says true, both sides are destroyed.
 */
export class CuttingProxy {
  private readonly sockets = new Set<net.Socket>();
  connections = 0;
  /** What each connection's client sent, by connection number. */
  readonly sent: string[] = [];

  private constructor(
    private readonly server: net.Server,
    readonly url: string,
  ) {}

  static async start(
    target: string,
    cut: (connection: number, received: string) => boolean,
  ): Promise<CuttingProxy> {
    const { hostname, port } = new URL(target);
    const server = net.createServer();
    const listening = new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    await listening;
    const url = `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
    const proxy = new CuttingProxy(server, url);
    server.on("connection", (client) => {
      const number = proxy.connections++;
      const upstream = net.connect(Number(port), hostname);
      proxy.sockets.add(client).add(upstream);
      let received = "";
      const close = () => {
        client.destroy();
        upstream.destroy();
      };
      proxy.sent[number] = "";
      client.on("data", (chunk: Buffer) => {
        proxy.sent[number] += chunk.toString("utf8");
        upstream.write(chunk);
      });
      upstream.on("data", (chunk: Buffer) => {
        received += chunk.toString("utf8");
        if (cut(number, received)) {
          close();
          return;
        }
        client.write(chunk);
      });
      for (const socket of [client, upstream]) {
        socket.on("error", close);
        socket.on("close", () => {
          proxy.sockets.delete(socket);
          close();
        });
      }
    });
    return proxy;
  }

  async stop(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

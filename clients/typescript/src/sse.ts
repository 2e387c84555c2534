// A Server-Sent Events parser, as the HTML standard's "event stream interpretation"
// describes it: lines end in CRLF, LF or CR; a blank line dispatches the event; a line
// starting with ':' is a comment; the fields are event, data, id and retry.

/** One event as the stream carried it. */
export interface SseEvent {
  /** The event's `id:` field, or undefined when it had none (a `gap`, for instance). */
  id: string | undefined;
  /** The event's type (`message` when the stream named none). */
  event: string;
  /** The `data:` lines, joined with newlines. */
  data: string;
}

/** Turns chunks of bytes into events; feed it with `push`, end it with `end`. */
export class SseParser {
  private readonly decoder = new TextDecoder("utf-8");
  private buffer = "";
  private pendingCr = false;
  private event = "";
  private data: string[] = [];
  private id: string | undefined = undefined;
  private sawField = false;

  /** Parse a chunk; return the events it completed. */
  push(chunk: Uint8Array): SseEvent[] {
    return this.lines(this.decoder.decode(chunk, { stream: true }));
  }

  /** The stream ended: an event not followed by a blank line is dropped, as the standard says. */
  end(): SseEvent[] {
    this.lines(this.decoder.decode());
    return [];
  }

  private lines(text: string): SseEvent[] {
    const out: SseEvent[] = [];
    let start = 0;
    let i = 0;
    if (this.pendingCr && text.startsWith("\n")) {
      start = i = 1; // the LF of a CRLF split across two chunks
    }
    this.pendingCr = false;
    for (; i < text.length; i++) {
      const c = text[i];
      if (c !== "\n" && c !== "\r") continue;
      const line = this.buffer + text.slice(start, i);
      this.buffer = "";
      if (c === "\r") {
        if (i + 1 === text.length) this.pendingCr = true;
        else if (text[i + 1] === "\n") i++;
      }
      start = i + 1;
      const event = this.line(line);
      if (event !== undefined) out.push(event);
    }
    this.buffer += text.slice(start);
    return out;
  }

  private line(line: string): SseEvent | undefined {
    if (line === "") {
      if (!this.sawField) return undefined;
      const event: SseEvent = {
        id: this.id,
        event: this.event === "" ? "message" : this.event,
        data: this.data.join("\n"),
      };
      this.event = "";
      this.data = [];
      this.id = undefined;
      this.sawField = false;
      return event;
    }
    if (line.startsWith(":")) return undefined; // a comment: the server's keep-alive
    const colon = line.indexOf(":");
    const name = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    this.sawField = true;
    if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    else if (name === "id" && !value.includes("\0")) this.id = value;
    return undefined;
  }
}

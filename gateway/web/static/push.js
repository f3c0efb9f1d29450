// Minimal browser push client (the JS twin of gateway.push.client): SSE via fetch(), one
// position {epoch, offset} per topic, gaps filled from /v1/feed, each row delivered once and
// in order per topic. fetch() instead of EventSource because rows arrive as named events
// (event: <kind>) and EventSource only reports the names it was told in advance.
"use strict";

class GatewayPush {
  constructor(topics, { onRow, onState = () => {}, pollMs = 5000, base = "", since = {}, token = null, credential = null } = {}) {
    this.topics = topics;
    // A credential with feed:read and the topics, sent as a header (fetch can; EventSource
    // could not, which is what ?access_token= on /v1/stream is for). `credential`, an async
    // function, is asked before every connect and feed read: a stream ended at token expiry
    // or revocation resumes from its cursor with what it returns (refresh the token there;
    // GatewayPush.refresher does, with a refresh token). A credential with an invalidate()
    // method is told when the server ended a stream for its token or answered 401.
    // A 401 or 403 stops the client (after one new credential for a 401 where the
    // credential has invalidate()): onState("refused", error) says why, and so does
    // this.error; a refused refresh token stops it with onState("signed-out", error).
    this.token = token;
    this.credential = credential;
    this.onRow = onRow;
    this.onState = onState;
    this.pollMs = pollMs;
    this.base = base;
    this.tracks = Object.fromEntries(topics.map((t) => [t, { epoch: null, offset: t in since ? since[t] : null }]));
    this.stopped = false;
    this.busy = Promise.resolve();
  }

  stop() {
    this.stopped = true;
  }

  async auth() {
    const token = this.credential ? await this.credential() : this.token;
    return token ? { Authorization: `Bearer ${token}` } : {};
  }

  credentialEnded() {
    if (this.credential && typeof this.credential.invalidate === "function") this.credential.invalidate();
  }

  // A credential function that keeps an access token fresh through POST /v1/auth/refresh:
  // refreshed a quarter of its life before it ends (at most marginMs) and at once after the
  // server ended or refused it; each refresh rotates the refresh token (onRotate gets it).
  // A refused refresh token throws an error named "RefreshRefused": the client stops.
  static refresher(base, refreshToken, { accessToken = null, expiresIn = null, marginMs = 30000, onRotate = () => {} } = {}) {
    let access = accessToken;
    let refreshAt = accessToken && expiresIn ? Date.now() + expiresIn * 1000 - Math.min(marginMs, expiresIn * 250) : 0;
    let stale = !accessToken;
    let pending = null;
    const refresh = async () => {
      const resp = await fetch(`${base}/v1/auth/refresh`, {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ refresh_token: refreshToken }),
      });
      if (resp.status === 401) {
        const error = new Error(`refresh refused: ${(await resp.text()).slice(0, 300)}`);
        error.name = "RefreshRefused";
        throw error;
      }
      if (!resp.ok) throw new Error(`refresh answered ${resp.status}`);
      const body = await resp.json();
      access = body.access_token;
      refreshToken = body.refresh_token;
      refreshAt = Date.now() + body.expires_in * 1000 - Math.min(marginMs, body.expires_in * 250);
      stale = false;
      onRotate(refreshToken);
    };
    const credential = async () => {
      if (stale || !access || Date.now() >= refreshAt) {
        pending = pending || refresh().finally(() => { pending = null; });  // one at a time
        await pending;
      }
      return access;
    };
    credential.invalidate = () => { stale = true; };
    return credential;
  }

  cursor() {
    return this.topics.filter((t) => this.tracks[t].offset !== null)
      .map((t) => `${t}:${this.tracks[t].offset}`).join(",");
  }

  // Every merge step runs one after the other, like the single task of the Python client.
  serial(fn) {
    this.busy = this.busy.then(fn, fn).catch((e) => console.warn("push:", e));
    return this.busy;
  }

  static parseCursor(text) {
    const out = {};
    for (const part of (text || "").split(",")) {
      const i = part.lastIndexOf(":");
      if (i > 0) out[part.slice(0, i)] = Number(part.slice(i + 1));
    }
    return out;
  }

  async start() {
    let backoff = 100;
    let retriedRefused = false;  // a 401 retried once with a new credential since the last connect
    while (!this.stopped) {
      try {
        await this.streamOnce(() => { retriedRefused = false; });
        backoff = 100;
      } catch (e) {
        if (e && e.name === "RefreshRefused") {  // only a new login helps
          this.stopped = true;
          this.onState("signed-out", e);
          return;
        }
        if (e && e.name === "AccessRefused") {
          // 401/403: the same credential again cannot help. A refreshing credential gets one
          // new token for a 401 first; then the client stops and says why.
          const refreshable = this.credential && typeof this.credential.invalidate === "function";
          if (e.status !== 401 || !refreshable || retriedRefused) {
            this.stopped = true;
            this.error = e;
            console.error("push: stopped:", e.message);
            this.onState("refused", e);
            return;
          }
          retriedRefused = true;
        }
        console.info("push: stream interrupted", e);
      }
      this.onState("reconnecting");
      await this.serial(() => this.fillAll());
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(backoff * 2, 5000);
    }
  }

  // The error of a refused stream or feed read: 401/403 stop the client (see start).
  async refusal(what, resp) {
    const body = (await resp.text()).slice(0, 300);
    if (resp.status === 401) this.credentialEnded();
    const error = new Error(resp.status === 401
      ? `${what} answered 401 ${body}: no credential, or one the server refuses (give token or credential)`
      : resp.status === 403
        ? `${what} answered 403 ${body}: the credential may not read these topics (it needs feed:read and each topic)`
        : `${what} answered ${resp.status} ${body}`);
    if (resp.status === 401 || resp.status === 403) {
      error.name = "AccessRefused";
      error.status = resp.status;
    }
    return error;
  }

  async streamOnce(onConnected = () => {}) {
    const params = new URLSearchParams({ topics: this.topics.join(",") });
    const since = this.cursor();
    if (since) params.set("since", since);
    const resp = await fetch(`${this.base}/v1/stream?${params}`, { headers: { Accept: "text/event-stream", ...(await this.auth()) } });
    if (!resp.ok) throw await this.refusal("stream", resp);
    onConnected();
    this.adopt(resp.headers);
    await this.serial(() => this.fillAll());
    this.onState("live");
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let timer = null;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => { this.serial(() => this.fillAll()); arm(); }, this.pollMs);
    };
    arm();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        arm();
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          this.handleBlock(block);
        }
      }
    } finally {
      clearTimeout(timer);
    }
  }

  handleBlock(block) {
    let event = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const name = i < 0 ? line : line.slice(0, i);
      const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
      if (name === "event") event = value;
      else if (name === "data") data.push(value);
    }
    if (!data.length) return;
    if (event === "gateway.disconnect") {
      console.warn("push: server closed", data.join("\n"));
      let reason = null;
      try { reason = JSON.parse(data.join("\n")).reason; } catch (e) { /* not JSON */ }
      if (reason === "token_expired" || reason === "revoked") this.credentialEnded();
      return;
    }
    const row = JSON.parse(data.join("\n"));
    this.serial(() => this.onEvent(row));
  }

  adopt(headers) {
    const offsets = GatewayPush.parseCursor(headers.get("X-Stream-Cursor"));
    const epochs = GatewayPush.parseCursor(headers.get("X-Stream-Epochs"));
    for (const t of this.topics) {
      const tr = this.tracks[t];
      if (!(t in offsets) || !(t in epochs)) continue;
      if (tr.offset === null) { tr.epoch = epochs[t]; tr.offset = offsets[t]; }
      else if (tr.epoch === null) { tr.epoch = epochs[t]; tr.offset = Math.min(tr.offset, offsets[t]); }
      else if (tr.epoch !== epochs[t]) { tr.epoch = epochs[t]; tr.offset = 0; }
    }
  }

  async onEvent(row) {
    const tr = this.tracks[row.topic];
    if (!tr || tr.offset === null) return;
    if (tr.epoch !== null && row.epoch !== tr.epoch) {
      if (row.epoch > tr.epoch) { tr.epoch = row.epoch; tr.offset = 0; await this.fill(row.topic); }
      return;
    }
    tr.epoch = row.epoch;
    if (row.offset <= tr.offset) return;
    if (row.offset > tr.offset + 1) {
      await this.fill(row.topic);
      if (row.offset <= tr.offset) return;
    }
    this.deliver(row);
  }

  deliver(row) {
    this.tracks[row.topic].offset = row.offset;
    try { this.onRow(row); } catch (e) { console.error(e); }
  }

  async fillAll() {
    for (const t of this.topics) await this.fill(t);
  }

  async fill(topic) {
    const tr = this.tracks[topic];
    if (tr.offset === null) return;
    for (;;) {
      const params = new URLSearchParams({ topic, after: String(tr.offset), limit: "500" });
      const resp = await fetch(`${this.base}/v1/feed?${params}`, { headers: await this.auth() });
      if (!resp.ok) throw await this.refusal("feed", resp);
      const body = await resp.json();
      if (tr.epoch !== null && body.epoch !== tr.epoch) { tr.epoch = body.epoch; tr.offset = 0; continue; }
      tr.epoch = body.epoch;
      for (const row of body.rows) if (row.offset > tr.offset) this.deliver(row);
      if (body.rows.length < 500) return;
    }
  }
}

window.GatewayPush = GatewayPush;

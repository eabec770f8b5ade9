// Follow one job's event stream with Node's `eventsource` package (the WHATWG EventSource), exactly as a web or
// Node client would, and let it reconnect by itself. Prints one JSON line per happening on stdout:
//   {"open": true}                                 each time a connection opens
//   {"event", "id", "type"}                        each event received (type: the envelope's domain/type)
//   {"closed": true, "status": <code or null>}     when EventSource gave up for good (readyState CLOSED)
// and exits 0 then. Usage: node follow.mjs <events URL> [Last-Event-ID]
import { EventSource } from "eventsource";

const [url, lastEventId] = process.argv.slice(2);
const say = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const source = new EventSource(url, {
  // the initial Last-Event-ID, as a browser that resumes a stream would send it
  fetch: (input, init) =>
    fetch(input, lastEventId === undefined || init.headers["Last-Event-ID"] !== undefined
      ? init
      : { ...init, headers: { ...init.headers, "Last-Event-ID": lastEventId } }),
});
const seen = (e) => {
  say({ event: e.type, id: e.lastEventId, type: JSON.parse(e.data).type });
};
source.addEventListener("open", () => say({ open: true }));
source.addEventListener("message", seen);
source.addEventListener("done", seen);
source.addEventListener("error", (e) => {
  if (e.data !== undefined) {
    seen(e); // the stream's own `error` event (an AIFlowy error envelope), not a connection failure
  } else if (source.readyState === EventSource.CLOSED) {
    say({ closed: true, status: e.code ?? null });
    process.exit(0);
  }
  // otherwise: a connection failure EventSource retries by itself
});

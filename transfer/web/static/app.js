// The upload page: resumable uploads through tus (tus-js-client), a progress bar per file, then the caller's files
// with copy descriptor / copy URL / delete. Talks only to this service; the API key (when keys are on) stays in this
// tab's sessionStorage and travels as a Bearer token.
"use strict";

(function () {
  const TUS_ENDPOINT = "/tus/files/";
  const CHUNK_SIZE = 8 * 1024 * 1024; // one PATCH per 8 MiB: a lost connection costs at most that much
  // retry for about five minutes: long enough for a server restart on a busy machine
  const RETRY_DELAYS = [0, 1000, 2000, 3000, 5000, 5000, 10000, 10000, 10000, 15000, 15000, 20000, 20000,
    30000, 30000, 30000, 30000, 30000, 30000];
  const KEY_STORAGE = "transfer.api-key";
  const keysOn = document.body.dataset.keys === "on";
  const $ = (id) => document.getElementById(id);

  function apiKey() { return sessionStorage.getItem(KEY_STORAGE) || ""; }
  function authHeaders() { return apiKey() ? { Authorization: "Bearer " + apiKey() } : {}; }

  function formatSize(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      if (body && body.error) return body.error.code + ": " + body.error.message;
    } catch (e) { /* not JSON */ }
    return "HTTP " + response.status;
  }

  async function copy(text, button) {
    try {
      await navigator.clipboard.writeText(text);
    } catch (e) { // not a secure context, or no permission: the old way
      const area = document.createElement("textarea");
      area.value = text;
      document.body.appendChild(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    const label = button.textContent;
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = label; }, 1500);
  }

  // --- API key ---
  if (keysOn) {
    $("key").hidden = false;
    $("api-key").value = apiKey();
    $("save-key").addEventListener("click", () => {
      sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
      $("key-status").textContent = apiKey() ? "key set for this tab" : "no key";
      refresh();
    });
  }

  // --- uploads ---
  function shouldRetry(err) {
    const response = err.originalResponse;
    const status = response ? response.getStatus() : 0;
    // tus-js-client's own rule: a network error or 5xx is worth retrying, a 4xx other than 409/423 is not
    return !(status >= 400 && status < 500 && status !== 409 && status !== 423);
  }

  function startUpload(file) {
    const row = document.createElement("li");
    row.dataset.state = "starting";
    row.innerHTML = '<span class="name"></span><progress max="100" value="0"></progress><span class="status"></span>';
    row.querySelector(".name").textContent = file.name;
    $("uploads").appendChild(row);
    const bar = row.querySelector("progress");
    const status = row.querySelector(".status");
    const say = (state, text) => { row.dataset.state = state; row.className = state; status.textContent = text; };
    if (!window.tus || !window.tus.isSupported) {
      say("failed", "tus-js-client is not installed on the server: this page cannot upload (see the notice above)");
      return;
    }
    let retried = false;
    const upload = new window.tus.Upload(file, {
      endpoint: TUS_ENDPOINT,
      chunkSize: CHUNK_SIZE,
      retryDelays: RETRY_DELAYS,
      removeFingerprintOnSuccess: true,
      headers: authHeaders(),
      metadata: { filename: file.name, filetype: file.type || "" },
      onUploadUrlAvailable() { row.dataset.uploadUrl = upload.url; },
      onProgress(sent, total) {
        bar.value = total ? (100 * sent) / total : 100;
        if (retried) row.dataset.resumed = "yes";
        say("uploading", (retried ? "resumed: " : "") + formatSize(sent) + " of " + formatSize(total));
      },
      onShouldRetry(err, attempt) {
        const retry = shouldRetry(err);
        if (retry) {
          retried = true;
          say("retrying", "connection lost; retrying (attempt " + (attempt + 1) + ")… the upload resumes where it stopped");
        }
        return retry;
      },
      onError(err) { say("failed", "upload failed: " + err.message); },
      async onSuccess() {
        bar.value = 100;
        let checksum = "";
        try { // the descriptor first: a row that says "done" names its file
          const response = await fetch(upload.url + "/descriptor", { headers: authHeaders() });
          if (response.ok) {
            const descriptor = await response.json();
            row.dataset.fileId = descriptor.metadata.file_id;
            checksum = " · " + descriptor.checksum;
          }
        } catch (e) { /* the upload is done all the same; the list below shows it */ }
        say("done", "uploaded " + formatSize(file.size) + (retried ? " (resumed after a lost connection)" : "") + checksum);
        refresh();
      },
    });
    upload.findPreviousUploads().then((previous) => {
      if (previous.length) upload.resumeFromPreviousUpload(previous[0]); // the same file after a reload
      say("uploading", previous.length ? "resuming an earlier upload…" : "starting…");
      upload.start();
    });
  }

  function addFiles(files) { for (const file of files) startUpload(file); }

  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    addFiles(e.dataTransfer.files);
  });
  $("pick").addEventListener("change", (e) => { addFiles(e.target.files); e.target.value = ""; });

  // --- the caller's files ---
  function fileRow(d) {
    const tr = document.createElement("tr");
    tr.dataset.fileId = d.metadata.file_id;
    for (const [text, cls] of [[d.name, ""], [formatSize(d.size), ""], [d.content_type, ""],
      [d.checksum.replace("sha256:", "").slice(0, 16) + "…", "sha"]]) {
      const td = document.createElement("td");
      td.textContent = text;
      if (cls) td.className = cls;
      tr.appendChild(td);
    }
    const actions = document.createElement("td");
    actions.className = "actions";
    const button = (label, onClick) => {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "small";
      b.textContent = label;
      b.addEventListener("click", () => onClick(b));
      actions.appendChild(b);
    };
    button("Copy descriptor", (b) => copy(JSON.stringify(d, null, 2), b));
    button("Copy URL", (b) => copy(d.url, b));
    button("Delete", async (b) => {
      if (b.dataset.armed !== "yes") { b.dataset.armed = "yes"; b.textContent = "Really delete?"; return; }
      const response = await fetch("/v1/files/" + encodeURIComponent(d.metadata.file_id),
        { method: "DELETE", headers: authHeaders() });
      if (response.ok) { tr.remove(); } else { $("list-status").textContent = "delete: " + await errorText(response); }
    });
    tr.appendChild(actions);
    return tr;
  }

  async function refresh() {
    const body = $("files").querySelector("tbody");
    const note = $("list-status");
    if (keysOn && !apiKey()) { note.textContent = "Enter your API key to upload and see your files."; return; }
    let response;
    try {
      response = await fetch("/v1/files", { headers: authHeaders() });
    } catch (e) {
      note.textContent = "the service is not reachable";
      return;
    }
    if (!response.ok) { note.textContent = await errorText(response); return; }
    const files = (await response.json()).files;
    body.replaceChildren(...files.map(fileRow));
    note.textContent = files.length ? "" : "No files yet.";
  }

  $("refresh").addEventListener("click", refresh);
  refresh();
})();

// The labelling page. Model text is untrusted: it is only ever put on the page with textContent.
"use strict";

(() => {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const token = location.pathname.split("/")[2];
  const api = (path) => `/api/${encodeURIComponent(token)}/${path}`;
  const byId = (id) => document.getElementById(id);
  const ROLES = new Set(["system", "user", "assistant", "tool"]);
  const NAMES = { a: "A is better", b: "B is better", tie: "tie", both_bad: "both bad", skip: "skipped" };

  let state = null;
  let busy = false;

  function requestId() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  // A string, or a conversation (a list of {role, content}) shown as turns.
  function showText(element, value) {
    element.replaceChildren();
    if (typeof value === "string") {
      element.classList.remove("turns");
      element.textContent = value;
      return;
    }
    element.classList.add("turns");
    for (const message of value) {
      const turn = document.createElement("div");
      const role = ROLES.has(message.role) ? message.role : "other";
      turn.className = `turn role-${role}`;
      const who = document.createElement("div");
      who.className = "role";
      who.textContent = message.role;
      const content = document.createElement("div");
      content.className = "content";
      content.textContent = message.content;
      turn.append(who, content);
      element.append(turn);
    }
  }

  function setStatus(text, kind) {
    const status = byId("status");
    status.textContent = text;
    status.className = `status ${kind || ""}`;
  }

  function render() {
    const { done, total } = state.progress;
    byId("progress").textContent = `${done} / ${total} labelled`;
    byId("progress-bar").max = Math.max(total, 1);
    byId("progress-bar").value = done;
    byId("undo").disabled = busy || !state.can_undo;
    const item = state.item;
    byId("labelling").hidden = item === null;
    byId("done").hidden = item !== null;
    byId("keys").hidden = item === null;
    if (item === null) {
      if (byId("status").classList.contains("ok")) setStatus("", "");  // the done card says it all
      byId("done-summary").textContent = `You labelled ${done} pair${done === 1 ? "" : "s"}; nothing is left for you.`;
      return;
    }
    if (byId("labelling").dataset.item !== String(item.id)) {
      byId("labelling").dataset.item = String(item.id);
      showText(byId("prompt"), item.prompt);
      showText(byId("response-a"), item.a);
      showText(byId("response-b"), item.b);
      byId("comment").value = "";
      document.querySelector('input[name="strength"][value=""]').checked = true;
      window.scrollTo(0, 0);
    }
    for (const button of document.querySelectorAll("[data-choice]")) button.disabled = busy;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // POST a JSON body; a request whose answer never arrived is sent again as it was (same request id),
  // and the server stores it once.
  async function post(path, body) {
    for (let attempt = 0; ; attempt++) {
      try {
        const response = await fetch(api(path), {
          method: "POST",
          headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
          body: JSON.stringify(body),
          credentials: "same-origin",
          cache: "no-store",
        });
        const data = await response.json();
        return { status: response.status, data };
      } catch (error) {
        setStatus("Connection lost; trying again… (your answer is kept until the server confirms it)", "error");
        await sleep(Math.min(500 * 2 ** attempt, 5000));
      }
    }
  }

  async function send(path, body, saved) {
    if (busy) return;
    busy = true;
    render();
    setStatus("Saving…", "pending");
    try {
      const { status, data } = await post(path, body);
      if (data.state) state = data.state;
      if (status === 200) setStatus(saved, "ok");
      else setStatus(data.error || `The server answered ${status}`, "error");
    } finally {
      busy = false;
      render();
    }
  }

  function choose(choice) {
    if (!state || !state.item || busy) return;
    const body = { request_id: requestId(), item_id: state.item.id, choice };
    const strength = document.querySelector('input[name="strength"]:checked').value;
    if (strength && (choice === "a" || choice === "b")) body.strength = strength;
    const comment = byId("comment").value.trim();
    if (comment) body.comment = comment;
    const how = body.strength ? ` (${body.strength})` : "";
    send("judge", body, `Saved: ${NAMES[choice]}${how}.`);
  }

  function undo() {
    if (!state || !state.can_undo || busy) return;
    send("undo", { request_id: requestId() }, "Last answer withdrawn: label it again.");
  }

  async function load() {
    for (let attempt = 0; ; attempt++) {
      try {
        const response = await fetch(api("state"), { cache: "no-store" });
        const data = await response.json();
        if (!response.ok) {
          setStatus(data.error || `The server answered ${response.status}`, "error");
          return;
        }
        state = data;
        render();
        return;
      } catch (error) {
        setStatus("Cannot reach the server; trying again…", "error");
        await sleep(Math.min(500 * 2 ** attempt, 5000));
      }
    }
  }

  const KEYS = { 1: "a", 2: "b", 3: "tie", 4: "both_bad", s: "skip" };

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    const target = event.target;
    if (target instanceof HTMLTextAreaElement || (target instanceof HTMLInputElement && target.type === "text")) return;
    const key = event.key.toLowerCase();
    if (key === "u") {
      event.preventDefault();
      undo();
    } else if (KEYS[key]) {
      event.preventDefault();
      choose(KEYS[key]);
    }
  });
  for (const button of document.querySelectorAll("[data-choice]")) {
    button.addEventListener("click", () => choose(button.dataset.choice));
  }
  byId("undo").addEventListener("click", undo);
  load();
})();

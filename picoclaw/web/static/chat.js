// The console's chat: sends a message, shows the answer as it streams in (one JSON event a line), each tool
// call as a card (its name; the arguments inside), Stop, and what the scheduler delivers and the receipts of memory
// writes while the page is open. Text is only ever set as textContent, with one exception: when a turn ends, its
// "done" event carries the answer's Markdown as HTML the server rendered (picoclaw/web/markdown.py: raw HTML in it
// escaped), which replaces the plain text that streamed in. A file chosen with Attach goes with the message as a
// multipart form; what it shows first (the transcript heard, "this model cannot see images") comes as "attached"
// events, shown as small notes. A tool call that asks first comes as an "approval" event: the call with Approve and
// Deny, which post the decision; "approval_done" shows what came of it. The labels ("You", "picoclaw") are the
// page's own (data attributes), as the reloaded page shows them.
"use strict";

(function () {
  const box = document.getElementById("conversation");
  const form = document.getElementById("chat");
  const input = document.getElementById("message");
  const send = document.getElementById("send");
  const stop = document.getElementById("stop");
  const attachment = document.getElementById("attachment");
  if (!box || !form) return;
  const name = box.dataset.name;
  const csrf = document.querySelector("meta[name=csrf-token]").content;

  function said(role, label) {
    const article = document.createElement("article");
    article.className = "said " + role;
    const meta = document.createElement("p");
    meta.className = "meta";
    meta.textContent = label;
    const text = document.createElement("pre");
    article.append(meta, text);
    box.append(article);
    article.scrollIntoView({block: "end"});
    return text;
  }

  // A tool call as the reloaded page shows it: a card with the tool's name, its arguments inside.
  function toolCard(target, text) {
    const space = text.indexOf(" ");
    const card = document.createElement("details");
    card.className = "event tool";
    const summary = document.createElement("summary");
    summary.textContent = "🔧 " + (space < 0 ? text : text.slice(0, space));
    const label = document.createElement("p");
    label.className = "meta";
    label.textContent = box.dataset.arguments;
    const args = document.createElement("pre");
    args.textContent = space < 0 ? "" : text.slice(space + 1);
    card.append(summary, label, args);
    target.parentElement.parentElement.insertBefore(card, target.parentElement);
  }

  // The finished answer: the server's rendered HTML in place of the plain text that streamed in.
  function finished(target, html) {
    const body = document.createElement("div");
    body.className = "markdown";
    body.innerHTML = html;
    target.replaceWith(body);
  }

  function line(target, kind, text) {
    const p = document.createElement("p");
    p.className = "event " + kind;
    p.textContent = text;
    target.parentElement.insertBefore(p, target);
  }

  function request(text, file) {
    if (!file) {
      return {
        method: "POST", credentials: "same-origin",
        headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
        body: JSON.stringify({name: name, text: text}),
      };
    }
    const body = new FormData();  // the browser sets the multipart Content-Type, with its boundary
    body.append("name", name);
    body.append("text", text);
    body.append("file", file, file.name);
    return {method: "POST", credentials: "same-origin", headers: {"X-CSRF-Token": csrf}, body: body};
  }

  // The question before an ask-first tool call: the call, and two buttons whose press posts the decision.
  const asked = {};
  function approval(target, question) {
    const card = document.createElement("div");
    card.className = "event approval";
    const call = document.createElement("p");
    call.textContent = box.dataset.ask + " " + question.tool + (question.arguments ? ": " + question.arguments : "");
    const outcome = document.createElement("p");
    outcome.className = "meta";
    card.append(call, outcome);
    for (const [decision, label] of [["approve", box.dataset.approve], ["deny", box.dataset.deny]]) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = decision === "deny" ? "danger" : "";
      button.dataset.decision = decision;
      button.textContent = label;
      button.addEventListener("click", async function () {
        const body = new URLSearchParams({name: name, id: question.id, decision: decision, csrf_token: csrf});
        const response = await fetch("/chat/approve", {method: "POST", credentials: "same-origin", body: body});
        const answer = response.ok ? await response.json() : {decided: false};
        if (!answer.decided) outcome.textContent = box.dataset.closed;
      });
      card.append(button);
    }
    target.parentElement.insertBefore(card, target);
    asked[question.id] = card;
  }
  function approvalDone(done) {
    const card = asked[done.id];
    if (!card) return;
    card.querySelectorAll("button").forEach(function (button) { button.remove(); });
    const labels = {"approved": box.dataset.approved, "denied": box.dataset.denied,
                    "timed out": box.dataset.timedOut};
    card.querySelector(".meta").textContent = labels[done.verdict] || done.verdict;
  }

  async function turn(text, file) {
    said("user", box.dataset.you).textContent = text + (file ? (text ? "\n" : "") + "📎 " + file.name : "");
    const answer = said("assistant", box.dataset.assistant);
    send.disabled = true;
    stop.disabled = false;
    try {
      const response = await fetch("/chat/turn", request(text, file));
      if (!response.ok) {
        answer.textContent = box.dataset.failed + " (" + response.status + ") " + (await response.text());
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let pending = "";
      let streamed = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        pending += decoder.decode(value, {stream: true});
        let end;
        while ((end = pending.indexOf("\n")) >= 0) {
          const event = JSON.parse(pending.slice(0, end));
          pending = pending.slice(end + 1);
          if (event.kind === "text") {
            streamed += event.text;
            answer.textContent = streamed;
          } else if (event.kind === "attached") {
            line(answer, "notice receipt attached", event.text);
          } else if (event.kind === "approval") {
            approval(answer, JSON.parse(event.text));
          } else if (event.kind === "approval_done") {
            approvalDone(JSON.parse(event.text));
          } else if (event.kind === "tool") {
            toolCard(answer, event.text);
          } else if (event.kind === "notice") {
            line(answer, event.kind, "· " + event.text);
          } else if (event.kind === "done" && typeof event.html === "string") {
            finished(answer, event.html);
          } else if (event.kind === "done" || event.kind === "error") {
            answer.textContent = event.text;
            if (event.kind === "error") answer.classList.add("error");
          } else if (event.kind === "stopped") {
            answer.textContent = streamed + (streamed ? "\n" : "") + box.dataset.stopped;
          }
        }
      }
    } catch (error) {
      answer.textContent = box.dataset.failed + ": " + error;
    } finally {
      send.disabled = false;
      stop.disabled = true;
    }
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    const text = input.value.trim();
    const file = attachment && attachment.files.length ? attachment.files[0] : null;
    if (!text && !file) return;
    input.value = "";
    if (attachment) attachment.value = "";
    turn(text, file);
  });
  input.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {  // IME composition: Chinese input
      event.preventDefault();
      form.requestSubmit();
    }
  });
  stop.addEventListener("click", function () {
    const body = new URLSearchParams({name: name, csrf_token: csrf});
    fetch("/chat/stop", {method: "POST", credentials: "same-origin", body: body});
  });
  // A receipt of what was written to memory without a command ("remembered: …"): a small note, once.
  function receipt(text) {
    const p = document.createElement("p");
    p.className = "event notice receipt";
    p.textContent = "✍ " + text;
    box.append(p);
    p.scrollIntoView({block: "end"});
  }

  // What arrives while the page is open: the scheduler's deliveries, and the receipts of memory writes (they
  // come after the reply, from work done in the background, so here and not in the turn's own stream).
  const events = new EventSource("/chat/events?name=" + encodeURIComponent(name));
  events.onmessage = function (message) {
    const event = JSON.parse(message.data);
    if (event.kind === "notice") receipt(event.text);
    else said("delivered", "⏰").textContent = event.text;
  };
})();

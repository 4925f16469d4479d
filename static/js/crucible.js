// Live pages: on every (re)connect, tell the server the last event this page shows, so it
// sends exactly the events after it — none skipped, none repeated.
function lastShownEventId(socketElt) {
  let last = Number(socketElt.dataset.lastEventId || 0);
  socketElt.querySelectorAll("[data-event-id]").forEach(function (node) {
    last = Math.max(last, Number(node.dataset.eventId));
  });
  return last;
}
document.addEventListener("htmx:wsOpen", function (event) {
  const socketElt = event.target;
  socketElt.classList.add("connected");
  socketElt._crucibleSocket = event.detail.socketWrapper;
  socketElt.querySelectorAll("[data-live-toggle]").forEach(function (button) { button.hidden = false; });
  if (socketElt.dataset.paused !== "true") {
    event.detail.socketWrapper.send(JSON.stringify({ type: "resume", last_id: lastShownEventId(socketElt) }));
  }
});
document.addEventListener("htmx:wsClose", function (event) {
  event.target.classList.remove("connected");
});
// Paused: messages are dropped; resuming asks again for everything after the last shown event,
// and the fragments that come with them bring every row and summary up to date.
document.addEventListener("htmx:wsBeforeMessage", function (event) {
  if (event.target.dataset.paused === "true") event.preventDefault();
});
document.addEventListener("click", function (event) {
  const button = event.target.closest("[data-live-toggle]");
  if (!button) return;
  const socketElt = button.closest("[ws-connect]");
  const pausing = socketElt.dataset.paused !== "true";
  socketElt.dataset.paused = pausing ? "true" : "false";
  socketElt.classList.toggle("paused", pausing);
  button.setAttribute("aria-pressed", pausing ? "true" : "false");
  button.textContent = pausing ? "Resume live updates" : "Pause live updates";
  if (!pausing && socketElt._crucibleSocket) {
    socketElt._crucibleSocket.send(JSON.stringify({ type: "resume", last_id: lastShownEventId(socketElt) }));
  }
});
// Keep long-running pages light: only the newest 200 events stay in a log.
document.addEventListener("htmx:wsAfterMessage", function (event) {
  event.target.querySelectorAll(".event-log").forEach(function (log) {
    while (log.children.length > 200) log.lastElementChild.remove();
  });
});
// A live message carries out-of-band swaps for every part a page of its subject may show; this
// page may not show some (a candidate on another page of the table, or filtered out). Those are
// dropped here, so htmx never reports htmx:oobErrorNoTarget for them.
function oobTarget(element) {
  const spec = element.getAttribute("hx-swap-oob") || "true";
  const colon = spec.indexOf(":");
  return colon >= 0 ? spec.slice(colon + 1) : (element.id ? "#" + CSS.escape(element.id) : null);
}
htmx.defineExtension("live-oob", {
  transformResponse: function (text) {
    const template = document.createElement("template");
    template.innerHTML = text;
    let dropped = false;
    Array.from(template.content.children).forEach(function (element) {
      const target = oobTarget(element);
      if (target && !document.querySelector(target)) { element.remove(); dropped = true; }
    });
    return dropped ? template.innerHTML : text;
  },
});
// A running search's or run's elapsed time moves on each second between live updates: from the
// figure the server last sent (data-elapsed) plus the time since this page first saw it, so
// the browser's clock being wrong cannot skew it. runtime_app/clock.py says it the same way.
function clockText(seconds) {
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 60) return seconds + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + (seconds % 60) + " s";
  return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
}
setInterval(function () {
  const now = performance.now();
  document.querySelectorAll(".ticking[data-elapsed]").forEach(function (clock) {
    if (!clock.dataset.seenAt) clock.dataset.seenAt = String(now);
    clock.textContent = clockText(Number(clock.dataset.elapsed) + (now - Number(clock.dataset.seenAt)) / 1000);
  });
}, 1000);

// Live event logs: on every (re)connect, tell the server the last event this page shows,
// so it sends exactly the events after it — none skipped, none repeated.
document.addEventListener("htmx:wsOpen", function (event) {
  const socketElt = event.target;
  let last = Number(socketElt.dataset.lastEventId || 0);
  socketElt.querySelectorAll("[data-event-id]").forEach(function (node) {
    last = Math.max(last, Number(node.dataset.eventId));
  });
  socketElt.classList.add("connected");
  event.detail.socketWrapper.send(JSON.stringify({ type: "resume", last_id: last }));
});
document.addEventListener("htmx:wsClose", function (event) {
  event.target.classList.remove("connected");
});
// Keep long-running pages light: only the newest 200 events stay in a log.
document.addEventListener("htmx:wsAfterMessage", function (event) {
  event.target.querySelectorAll(".event-log").forEach(function (log) {
    while (log.children.length > 200) log.lastElementChild.remove();
  });
});

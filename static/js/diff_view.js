// Patch viewer: draws each .diff-view's patch with the vendored diff2html (no highlight.js),
// with a side-by-side / unified toggle and large files collapsed. The server-rendered
// fallback stays until a draw succeeds, so the page works without JS or without diff2html.
(function () {
  "use strict";
  const FORMAT_KEY = "crucible.diffFormat";
  const FORMATS = ["side-by-side", "line-by-line"];
  const DEFAULT_LARGE_LINES = 400;
  const DEFAULT_RENDER_LIMIT = 5000;

  function savedFormat() {
    let format = null;
    try {
      format = localStorage.getItem(FORMAT_KEY);
    } catch (error) {
      // Storage can be disabled; the default format is then used.
    }
    return FORMATS.includes(format) ? format : FORMATS[0];
  }

  function saveFormat(format) {
    try {
      localStorage.setItem(FORMAT_KEY, format);
    } catch (error) {
      // Storage can be disabled; the choice then lasts for this page only.
    }
  }

  // Approximate ("+++"/"---" file headers skipped): it only decides whether to draw at once.
  function changedLineCount(patch) {
    let count = 0;
    for (const line of patch.split("\n")) {
      if ((line[0] === "+" && !line.startsWith("+++ ")) || (line[0] === "-" && !line.startsWith("--- "))) count++;
    }
    return count;
  }

  // Each changed line has one line-number cell in both formats (side by side: deletions left, insertions right).
  function fileChangedLines(wrapper) {
    return wrapper.querySelectorAll("td.d2h-ins:first-child, td.d2h-del:first-child").length;
  }

  function collapseLargeFiles(target, limit, expanded) {
    target.querySelectorAll(".d2h-file-wrapper").forEach(function (wrapper) {
      const body = wrapper.querySelector(".d2h-file-diff, .d2h-files-diff");
      const lines = fileChangedLines(wrapper);
      if (!body || lines <= limit) return;
      const button = document.createElement("button");
      button.type = "button";
      button.className = "diff-expand";
      function show(open) {
        // Inline style, so diff2html's own "Viewed" toggle cannot reveal a collapsed file.
        body.style.display = open ? "" : "none";
        button.setAttribute("aria-expanded", String(open));
        button.textContent = (open ? "Hide " : "Large file: show ") + lines.toLocaleString() + " changed lines";
      }
      button.addEventListener("click", function () {
        const open = button.getAttribute("aria-expanded") !== "true";
        if (open) expanded.add(wrapper.id);
        else expanded.delete(wrapper.id);
        show(open);
      });
      show(expanded.has(wrapper.id));
      wrapper.insertBefore(button, body);
    });
  }

  function setUp(view) {
    view.dataset.diffReady = "true";
    const source = document.getElementById(view.dataset.patchSource);
    const target = view.querySelector(".diff-rendered");
    if (!source || !target) return;
    const patch = JSON.parse(source.textContent);
    const fallback = view.querySelector(".diff-fallback");
    const toolbar = view.querySelector(".diff-toolbar");
    const largeLines = Number(view.dataset.largeLines) || DEFAULT_LARGE_LINES;
    const renderLimit = Number(view.dataset.renderLimit) || DEFAULT_RENDER_LIMIT;
    const expanded = new Set();
    let format = savedFormat();

    if (!patch.trim()) {
      const empty = document.createElement("p");
      empty.className = "empty-state";
      empty.textContent = "No changes.";
      target.replaceChildren(empty);
      if (fallback) fallback.hidden = true;
      return;
    }

    function draw() {
      new Diff2HtmlUI(target, patch, {
        outputFormat: format,
        drawFileList: true,
        matching: "lines",
        fileContentToggle: true,
        highlight: false,
      }).draw();
      collapseLargeFiles(target, largeLines, expanded);
      if (fallback) fallback.hidden = true;
      // Others (review_threads.js) decorate the drawn lines; a redraw replaces them all.
      view.dispatchEvent(new CustomEvent("crucible:diff-drawn", { bubbles: true }));
      if (toolbar) {
        toolbar.querySelectorAll("[data-diff-format]").forEach(function (button) {
          button.setAttribute("aria-pressed", String(button.dataset.diffFormat === format));
        });
        toolbar.hidden = false;
      }
    }

    if (toolbar) {
      toolbar.addEventListener("click", function (event) {
        const button = event.target.closest("[data-diff-format]");
        if (!button || !FORMATS.includes(button.dataset.diffFormat) || button.dataset.diffFormat === format) return;
        format = button.dataset.diffFormat;
        saveFormat(format);
        draw();
      });
    }

    const changed = changedLineCount(patch);
    if (changed <= renderLimit) {
      draw();
      return;
    }
    // Too big to draw unasked: keep the plain fallback and offer the full render above it.
    const notice = document.createElement("p");
    notice.className = "diff-notice";
    notice.textContent = "This patch changes about " + changed.toLocaleString() + " lines. ";
    const renderButton = document.createElement("button");
    renderButton.type = "button";
    renderButton.textContent = "Render the full diff";
    renderButton.addEventListener("click", function () {
      notice.remove();
      draw();
      // The clicked button is gone; keep keyboard focus in the view.
      const pressed = toolbar && toolbar.querySelector('[aria-pressed="true"]');
      if (pressed) pressed.focus();
    });
    notice.appendChild(renderButton);
    view.insertBefore(notice, fallback || target);
  }

  function setUpAll() {
    // Without the vendored bundle the server-rendered fallback is the view.
    if (typeof window.Diff2HtmlUI !== "function") return;
    document.querySelectorAll(".diff-view:not([data-diff-ready])").forEach(setUp);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUpAll);
  else setUpAll();
  document.addEventListener("htmx:afterSettle", setUpAll);
})();

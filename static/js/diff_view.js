// Patch viewer: draws each .diff-view's patch with the vendored diff2html (no highlight.js),
// with a side-by-side / unified toggle and large files collapsed. The server-rendered
// fallback stays until a draw succeeds, so the page works without JS or without diff2html.
// After a draw, side by side becomes one table per file (old number, old code, new number, new
// code), so both sides share each row's height and long lines wrap without losing alignment;
// every row carries data-old / data-new (its line numbers) for review_threads.js.
// Keys (outside text fields): n / j next file, p / k previous file, ] next thread, [ previous.
(function () {
  "use strict";
  const FORMAT_KEY = "crucible.diffFormat";  // + ".narrow" or ".wide": a choice per kind of screen
  const FORMATS = ["side-by-side", "line-by-line"];
  const NARROW = window.matchMedia ? window.matchMedia("(max-width: 699.98px)") : null;
  const DEFAULT_LARGE_LINES = 400;
  const DEFAULT_RENDER_LIMIT = 5000;

  function screenKind() {
    return NARROW && NARROW.matches ? "narrow" : "wide";
  }

  // Unified below 700 px (side by side leaves a phone ~10 characters of code), unless chosen.
  function savedFormat() {
    let format = null;
    try {
      format = localStorage.getItem(FORMAT_KEY + "." + screenKind());
      if (!format && screenKind() === "wide") format = localStorage.getItem(FORMAT_KEY);
    } catch (error) {
      // Storage can be disabled; the default format is then used.
    }
    if (FORMATS.includes(format)) return format;
    return screenKind() === "narrow" ? "line-by-line" : "side-by-side";
  }

  function saveFormat(format) {
    try {
      localStorage.setItem(FORMAT_KEY + "." + screenKind(), format);
    } catch (error) {
      // Storage can be disabled; the choice then lasts for this page only.
    }
  }

  function cellNumber(cell) {
    const number = cell ? Number((cell.textContent || "").trim()) : NaN;
    return Number.isInteger(number) && number > 0 ? number : null;
  }

  function numberCol(className) {
    const col = document.createElement("col");
    if (className) col.className = className;
    return col;
  }

  // diff2html's side by side is two tables whose rows pair by index; merge them into one.
  function mergeSides(filesDiff) {
    const sides = filesDiff.querySelectorAll(":scope > .d2h-file-side-diff");
    if (sides.length !== 2) return;
    const left = sides[0].querySelector("tbody");
    const right = sides[1].querySelector("tbody");
    if (!left || !right) return;
    const rightRows = Array.from(right.children);
    Array.from(left.children).forEach(function (row, index) {
      const twin = rightRows[index];
      const cells = Array.from(row.children);
      if (cells[0] && cells[0].classList.contains("d2h-info")) {
        if (cells[1]) cells[1].colSpan = 3;
        return;
      }
      const old = cellNumber(cells[0]);
      if (cells[0]) cells[0].dataset.side = "old";
      if (cells[1]) cells[1].dataset.side = "old";
      if (old) row.dataset.old = String(old);
      if (!twin) return;
      const twinCells = Array.from(twin.children);
      const added = cellNumber(twinCells[0]);
      twinCells.forEach(function (cell) {
        cell.dataset.side = "new";
        row.appendChild(cell);
      });
      if (added) row.dataset.new = String(added);
    });
    const table = left.closest("table");
    table.classList.add("diff-split");
    const cols = document.createElement("colgroup");
    cols.append(numberCol("num"), numberCol("code"), numberCol("num"), numberCol("code"));
    table.prepend(cols);
    sides[1].remove();
    filesDiff.classList.add("diff-merged");
  }

  function numberUnified(table) {
    table.querySelectorAll("tbody > tr").forEach(function (row) {
      const old = cellNumber(row.querySelector(".line-num1"));
      const added = cellNumber(row.querySelector(".line-num2"));
      if (old) row.dataset.old = String(old);
      if (added) row.dataset.new = String(added);
    });
    const cols = document.createElement("colgroup");
    cols.append(numberCol("num2"), numberCol("code"));
    table.prepend(cols);
  }

  // Both formats: plain table cells sized to the file's longest line number (diff2html
  // positions them absolutely, which clipped and shifted them once rows grew).
  function tidy(target) {
    target.querySelectorAll(".d2h-files-diff").forEach(mergeSides);
    target.querySelectorAll(".d2h-file-diff table.d2h-diff-table").forEach(numberUnified);
    target.querySelectorAll(".d2h-file-wrapper").forEach(function (wrapper) {
      let widest = 1;
      wrapper.querySelectorAll("tr[data-old], tr[data-new]").forEach(function (row) {
        widest = Math.max(widest, (row.dataset.old || "").length, (row.dataset.new || "").length);
      });
      wrapper.style.setProperty("--diff-digits", String(Math.max(widest, 3)));
      wrapper.tabIndex = -1;
    });
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
    return wrapper.querySelectorAll(
      "td.d2h-code-side-linenumber.d2h-ins, td.d2h-code-side-linenumber.d2h-del, "
      + "td.d2h-code-linenumber.d2h-ins, td.d2h-code-linenumber.d2h-del").length;
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
      tidy(target);
      target.dataset.format = format;
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
      if (!toolbar.querySelector(".diff-keys")) {
        const keys = document.createElement("span");
        keys.className = "diff-keys hint";
        keys.innerHTML = "Keys: <kbd>n</kbd>/<kbd>p</kbd> next/previous file · <kbd>]</kbd>/<kbd>[</kbd> next/previous thread";
        toolbar.appendChild(keys);
      }
      toolbar.addEventListener("click", function (event) {
        const button = event.target.closest("[data-diff-format]");
        if (!button || !FORMATS.includes(button.dataset.diffFormat) || button.dataset.diffFormat === format) return;
        format = button.dataset.diffFormat;
        saveFormat(format);
        draw();
      });
    }
    // Crossing 700 px (a turned phone, a narrowed window) takes that screen's format.
    if (NARROW && NARROW.addEventListener) {
      NARROW.addEventListener("change", function () {
        const wanted = savedFormat();
        if (wanted === format || !target.querySelector(".d2h-file-wrapper")) return;
        format = wanted;
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

  // ---- keys: between files and between threads, in document order

  function typing(target) {
    return target && target.closest && (target.isContentEditable
      || target.closest("input, textarea, select, [contenteditable], [role=textbox]"));
  }

  function visible(element) {
    return element.offsetParent !== null || element.getClientRects().length > 0;
  }

  // The next (step 1) or previous (-1) of `items` from the focused one, else from the screen's top.
  function pick(items, step) {
    const active = document.activeElement;
    const current = items.findIndex(function (item) { return item === active || item.contains(active); });
    if (current !== -1) return items[current + step] || null;
    const tops = items.map(function (item) { return item.getBoundingClientRect().top; });
    if (step > 0) return items[tops.findIndex(function (top) { return top > 8; })] || null;
    for (let index = items.length - 1; index >= 0; index--) if (tops[index] < -8) return items[index];
    return null;
  }

  function go(element, block) {
    if (!element) return;
    if (!element.hasAttribute("tabindex")) element.tabIndex = -1;
    element.classList.add("diff-nav-target");
    element.focus({ preventScroll: true });
    element.scrollIntoView({ block: block, behavior: "auto" });
  }

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    const files = Array.from(document.querySelectorAll(".diff-rendered .d2h-file-wrapper")).filter(visible);
    if (!files.length) return;
    let target = null;
    let block = "start";
    if (event.key === "n" || event.key === "j") target = pick(files, 1);
    else if (event.key === "p" || event.key === "k") target = pick(files, -1);
    else if (event.key === "]" || event.key === "[") {
      const threads = Array.from(document.querySelectorAll(
        ".diff-rendered li.thread, ol.threads:not(.inline) > li.thread[data-inline=false]")).filter(visible);
      target = pick(threads, event.key === "]" ? 1 : -1);
      block = "center";
    } else return;
    event.preventDefault();
    go(target, block);
  });

  function setUpAll() {
    // Without the vendored bundle the server-rendered fallback is the view.
    if (typeof window.Diff2HtmlUI !== "function") return;
    document.querySelectorAll(".diff-view:not([data-diff-ready])").forEach(setUp);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUpAll);
  else setUpAll();
  document.addEventListener("htmx:afterSettle", setUpAll);
})();

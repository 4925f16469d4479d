// Review threads in the drawn diff (diff2html, tidied by diff_view.js: every row has data-old and
// data-new line numbers). The lines a thread may start on, per file and side (the server's list,
// never guessed), get a button opening a small form under the line; each thread on a line of the
// current diff shows, as a copy, under its line and on its side. Side by side: the left half is the
// old side (deleted and context lines before the patch), the right half the new side. Unified: a
// deleted line is on the old side, added and context lines on the new side. The thread list below
// the diff stays the no-JavaScript view with the same forms; a redraw starts over.
(function () {
  "use strict";

  function anchorsOf(view) {
    const source = document.getElementById(view.dataset.commentAnchors || "");
    if (!source) return null;
    try {
      return JSON.parse(source.textContent);
    } catch (error) {
      return null;
    }
  }

  // diff2html names a renamed file "old → new"; threads are on the new path.
  function fileName(wrapper) {
    const name = wrapper.querySelector(".d2h-file-name");
    const text = name ? name.textContent.trim() : "";
    return text.includes("→") ? text.split("→").pop().trim() : text;
  }

  // The places of a file's drawn rows: {row, side, number, cell (its line-number cell)}.
  function places(wrapper) {
    const found = [];
    const split = !!wrapper.querySelector("table.diff-split");
    wrapper.querySelectorAll("tbody > tr[data-old], tbody > tr[data-new]").forEach(function (row) {
      if (split) {
        ["old", "new"].forEach(function (side) {
          const number = Number(row.dataset[side]);
          const cell = row.querySelector("td.d2h-code-side-linenumber[data-side='" + side + "']");
          if (number && cell) found.push({ row: row, side: side, number: number, cell: cell, split: true });
        });
      } else {
        // Unified: a deleted line only has an old number; other lines belong to the new side.
        const side = row.dataset.new ? "new" : "old";
        const cell = row.querySelector("td.d2h-code-linenumber");
        if (cell) found.push({ row: row, side: side, number: Number(row.dataset[side]), cell: cell, split: false });
      }
    });
    return found;
  }

  // A row under `place`'s line (after threads already there) whose cell covers its half of the
  // table side by side (the other half stays empty), or the whole width unified.
  function rowUnder(place, className) {
    const row = document.createElement("tr");
    row.className = "thread-row " + className;
    row.dataset.side = place.side;
    const cell = document.createElement("td");
    cell.colSpan = 2;
    if (place.split) {
      const other = document.createElement("td");
      other.colSpan = 2;
      other.className = "thread-other";
      if (place.side === "old") row.append(cell, other);
      else row.append(other, cell);
    } else {
      row.appendChild(cell);
    }
    let last = place.row;
    while (last.nextElementSibling && last.nextElementSibling.classList.contains("thread-row")) {
      last = last.nextElementSibling;
    }
    last.after(row);
    return { row: row, cell: cell };
  }

  // A copy of a listed thread, without ids (the original keeps them) and with its own label targets.
  function threadCopy(original) {
    const copy = original.cloneNode(true);
    copy.removeAttribute("id");
    copy.classList.remove("diff-nav-target");
    copy.querySelectorAll("[id]").forEach(function (element) {
      element.id = "inline-" + element.id;
    });
    copy.querySelectorAll("label[for]").forEach(function (label) {
      label.htmlFor = "inline-" + label.htmlFor;
    });
    const list = document.createElement("ol");
    list.className = "threads inline";
    list.appendChild(copy);
    return list;
  }

  function placeText(path, place) {
    return path + ":" + place.number + (place.side === "old" ? " (old side)" : "");
  }

  function openForm(place, path) {
    const template = document.getElementById("thread-new-form");
    if (!template) return;
    const key = place.side + ":" + place.number;
    const open = place.row.parentElement.querySelector(".thread-new-row[data-place='" + key + "']");
    if (open) {
      open.querySelector("textarea").focus();
      return;
    }
    const made = rowUnder(place, "thread-new-row");
    made.row.dataset.place = key;
    const form = template.content.firstElementChild.cloneNode(true);
    form.querySelector("input[name=path]").value = path;
    form.querySelector("input[name=line]").value = String(place.number);
    const side = form.querySelector("input[name=side]");
    if (side) side.value = place.side;
    form.querySelector(".thread-new-place").textContent = placeText(path, place);
    form.querySelector("[data-thread-cancel]").addEventListener("click", function () { made.row.remove(); });
    made.cell.appendChild(form);
    form.querySelector("textarea").focus({ preventScroll: true });
    // Keep the whole box on screen (it opens under the line, maybe below the fold).
    made.row.scrollIntoView({ block: "nearest", inline: "nearest" });
  }

  // Old anchors were a plain list of new-side lines; now {old: [...], new: [...]}.
  function allowedLines(anchors, path, side) {
    const entry = anchors[path];
    if (!entry) return new Set();
    if (Array.isArray(entry)) return new Set(side === "new" ? entry : []);
    return new Set(entry[side] || []);
  }

  function decorate(view) {
    const anchors = anchorsOf(view);
    if (!anchors) return;
    const threads = Array.from(document.querySelectorAll("ol.threads:not(.inline) > li.thread[data-inline=true]"));
    view.querySelectorAll(".diff-rendered .d2h-file-wrapper").forEach(function (wrapper) {
      const path = fileName(wrapper);
      const allowed = { old: allowedLines(anchors, path, "old"), new: allowedLines(anchors, path, "new") };
      const byCell = new Map();
      const all = places(wrapper);
      all.forEach(function (place) {
        if (!allowed[place.side].has(place.number)) return;
        place.row.classList.add("commentable");
        byCell.set(place.cell, place);
        const button = document.createElement("button");
        button.type = "button";
        button.className = "thread-add";
        button.textContent = "+";
        button.dataset.side = place.side;
        button.dataset.line = String(place.number);
        button.title = "Start a thread on " + placeText(path, place);
        button.setAttribute("aria-label", button.title);
        button.addEventListener("click", function (event) {
          event.stopPropagation();
          openForm(place, path);
        });
        place.cell.prepend(button);
      });
      // A click anywhere on a commentable line opens the form for the side clicked.
      wrapper.addEventListener("click", function (event) {
        if (event.target.closest("a, button, input, textarea, label, select, .thread-row")) return;
        const cell = event.target.closest("td");
        const row = cell && cell.closest("tr.commentable");
        if (!row) return;
        let place = null;
        byCell.forEach(function (candidate, numberCell) {
          if (numberCell.parentElement !== row) return;
          if (!candidate.split || cell.dataset.side === candidate.side || !place) place = candidate;
        });
        if (place) openForm(place, path);
      });
      threads.forEach(function (thread) {
        if (thread.dataset.path !== path) return;
        const side = thread.dataset.side === "old" ? "old" : "new";
        const number = Number(thread.dataset.line);
        // Unified shows an old-side thread on a context line under that line too.
        const place = all.find(function (item) { return item.side === side && item.number === number; })
          || all.filter(function (item) { return !item.split && Number(item.row.dataset[side]) === number; })
            .map(function (item) { return Object.assign({}, item, { side: side, number: number }); })[0];
        if (!place) return;
        rowUnder(place, "thread-inline-row").cell.appendChild(threadCopy(thread));
      });
    });
  }

  document.addEventListener("crucible:diff-drawn", function (event) { decorate(event.target); });
  // diff_view.js may have drawn before this file ran.
  function decorateDrawn() {
    document.querySelectorAll(".diff-view[data-comment-anchors]").forEach(function (view) {
      if (view.querySelector(".d2h-file-wrapper") && !view.querySelector(".thread-add")) decorate(view);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", decorateDrawn);
  else decorateDrawn();
})();

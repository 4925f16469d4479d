// Review threads in the drawn diff (diff2html, by diff_view.js): the new-side lines a thread may
// start on (the server's list, never guessed) get a button opening a small form under the line,
// and each thread on a line of the current diff shows, as a copy, under its line. The thread list
// below the diff stays the no-JavaScript view with the same forms; a redraw starts over.
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

  // Rows of the new side with their line number: the unified table, or the right-hand table
  // of side by side (whose left-hand table gets a spacer row for each row added on the right).
  function newSideRows(wrapper) {
    const rows = [];
    const sides = wrapper.querySelectorAll(".d2h-file-side-diff");
    if (sides.length === 2) {
      const left = sides[0].querySelectorAll("tbody > tr");
      sides[1].querySelectorAll("tbody > tr").forEach(function (row, index) {
        const cell = row.querySelector("td.d2h-code-side-linenumber");
        if (!cell || cell.classList.contains("d2h-emptyplaceholder") || cell.classList.contains("d2h-del")) return;
        rows.push({ row: row, cell: cell, number: Number(cell.textContent.trim()), twin: left[index] || null });
      });
    } else {
      wrapper.querySelectorAll("tbody > tr").forEach(function (row) {
        const cell = row.querySelector("td.d2h-code-linenumber");
        const number = cell && cell.querySelector(".line-num2");
        if (!number || !number.textContent.trim()) return;
        rows.push({ row: row, cell: cell, number: Number(number.textContent.trim()), twin: null });
      });
    }
    return rows.filter(function (item) { return Number.isInteger(item.number) && item.number > 0; });
  }

  // A full-width row under `item`'s line (and an empty one of the same height on the left side).
  function rowUnder(item, className) {
    const row = document.createElement("tr");
    row.className = "thread-row " + className;
    const cell = document.createElement("td");
    cell.colSpan = 2;
    row.appendChild(cell);
    let last = item.row;
    while (last.nextElementSibling && last.nextElementSibling.classList.contains("thread-row")) {
      last = last.nextElementSibling;
    }
    last.after(row);
    if (item.twin) {
      const spacer = document.createElement("tr");
      spacer.className = "thread-row thread-spacer";
      spacer.appendChild(document.createElement("td")).colSpan = 2;
      let twinLast = item.twin;
      while (twinLast.nextElementSibling && twinLast.nextElementSibling.classList.contains("thread-row")) {
        twinLast = twinLast.nextElementSibling;
      }
      twinLast.after(spacer);
      const fit = function () { spacer.style.height = row.offsetHeight + "px"; };
      if (window.ResizeObserver) new ResizeObserver(fit).observe(row);
      fit();
      row.spacer = spacer;
    }
    return { row: row, cell: cell };
  }

  function removeRow(row) {
    if (row.spacer) row.spacer.remove();
    row.remove();
  }

  // A copy of a listed thread, without ids (the original keeps them) and with its own label targets.
  function threadCopy(original) {
    const copy = original.cloneNode(true);
    copy.removeAttribute("id");
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

  function openForm(item, path) {
    const template = document.getElementById("thread-new-form");
    if (!template) return;
    const open = item.row.parentElement.querySelector(".thread-new-row[data-line='" + item.number + "']");
    if (open) {
      open.querySelector("textarea").focus();
      return;
    }
    const made = rowUnder(item, "thread-new-row");
    made.row.dataset.line = String(item.number);
    const form = template.content.firstElementChild.cloneNode(true);
    form.querySelector("input[name=path]").value = path;
    form.querySelector("input[name=line]").value = String(item.number);
    form.querySelector(".thread-new-place").textContent = path + ":" + item.number;
    form.querySelector("[data-thread-cancel]").addEventListener("click", function () { removeRow(made.row); });
    made.cell.appendChild(form);
    form.querySelector("textarea").focus();
  }

  function decorate(view) {
    const anchors = anchorsOf(view);
    if (!anchors) return;
    const threads = Array.from(document.querySelectorAll("ol.threads:not(.inline) > li.thread[data-inline=true]"));
    view.querySelectorAll(".diff-rendered .d2h-file-wrapper").forEach(function (wrapper) {
      const path = fileName(wrapper);
      const allowed = new Set(anchors[path] || []);
      newSideRows(wrapper).forEach(function (item) {
        if (!allowed.has(item.number)) return;
        item.row.classList.add("commentable");
        const button = document.createElement("button");
        button.type = "button";
        button.className = "thread-add";
        button.textContent = "+";
        button.title = "Start a thread on " + path + ":" + item.number;
        button.setAttribute("aria-label", button.title);
        button.addEventListener("click", function (event) {
          event.stopPropagation();
          openForm(item, path);
        });
        item.cell.prepend(button);
        item.row.addEventListener("click", function (event) {
          if (event.target.closest("a, button, input, textarea, label")) return;
          openForm(item, path);
        });
        threads.forEach(function (thread) {
          if (thread.dataset.path !== path || Number(thread.dataset.line) !== item.number) return;
          rowUnder(item, "thread-inline-row").cell.appendChild(threadCopy(thread));
        });
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

// The spec editor: line numbers beside the textarea, clickable validation errors that move
// the cursor to their line:column, the template picker, and the repository/ref pickers.
// Plain JS on top of htmx; the page works without it (the server renders everything).
(function () {
  "use strict";
  var GUTTER_MAX_LINES = 10000;

  function editor() { return document.getElementById("spec-text"); }
  function gutter() { return document.getElementById("spec-gutter"); }

  // --- line numbers -------------------------------------------------------------------
  function lineCount(text) {
    var count = 1;
    for (var i = text.indexOf("\n"); i !== -1; i = text.indexOf("\n", i + 1)) count++;
    return Math.min(count, GUTTER_MAX_LINES);
  }

  function renderGutter() {
    var area = editor(), numbers = gutter();
    if (!area || !numbers) return;
    var wanted = lineCount(area.value);
    if (numbers.childElementCount !== wanted) {
      var fragment = document.createDocumentFragment();
      for (var n = 1; n <= wanted; n++) {
        var span = document.createElement("span");
        span.dataset.line = String(n);
        span.textContent = String(n);
        fragment.appendChild(span);
      }
      numbers.replaceChildren(fragment);
      markErrorLines();
    }
    numbers.scrollTop = area.scrollTop;
  }

  function markErrorLines() {
    var numbers = gutter();
    if (!numbers) return;
    var bad = {};
    document.querySelectorAll("#validation .spec-error[data-line]").forEach(function (item) {
      bad[item.dataset.line] = true;
    });
    numbers.querySelectorAll("span.has-error").forEach(function (span) { span.classList.remove("has-error"); });
    Object.keys(bad).forEach(function (line) {
      var span = numbers.querySelector('span[data-line="' + line + '"]');
      if (span) span.classList.add("has-error");
    });
  }

  // --- moving the cursor to an error ----------------------------------------------------
  // The server counts columns in characters (code points); a JS string index counts UTF-16
  // code units, so walk the line by code points.
  function offsetOf(text, line, column) {
    var lines = text.split("\n");
    var index = Math.max(0, Math.min(line - 1, lines.length - 1));
    var offset = 0;
    for (var i = 0; i < index; i++) offset += lines[i].length + 1;
    var characters = Array.from(lines[index]).slice(0, Math.max(0, column - 1));
    return offset + characters.join("").length;
  }

  function lineHeight(area) {
    var value = parseFloat(window.getComputedStyle(area).lineHeight);
    return isNaN(value) ? 20 : value;
  }

  function goTo(line, column) {
    var area = editor();
    if (!area) return;
    var offset = offsetOf(area.value, line, column);
    area.focus({ preventScroll: true });
    area.setSelectionRange(offset, offset);
    area.scrollTop = Math.max(0, (line - 1) * lineHeight(area) - area.clientHeight / 3);
    area.scrollIntoView({ block: "nearest" });
    renderGutter();
    showPosition();
  }

  function showPosition() {
    var area = editor(), out = document.getElementById("cursor-position");
    if (!area || !out) return;
    var before = area.value.slice(0, area.selectionStart);
    var line = before.split("\n").length;
    var column = Array.from(before.slice(before.lastIndexOf("\n") + 1)).length + 1;
    out.textContent = "Line " + line + ", column " + column;
  }

  // --- templates --------------------------------------------------------------------------
  function templates() {
    var data = document.getElementById("spec-templates");
    return data ? JSON.parse(data.textContent) : {};
  }

  function useTemplate(slug) {
    var area = editor(), all = templates();
    if (!area || !(slug in all)) return false;
    var current = area.value.trim();
    var isTemplate = Object.keys(all).some(function (key) { return all[key].trim() === current; });
    if (current && !isTemplate && !window.confirm("Replace the editor's text with this template?")) return true;
    area.value = all[slug];
    area.dispatchEvent(new Event("input", { bubbles: true }));
    area.focus();
    area.setSelectionRange(0, 0);
    area.scrollTop = 0;
    renderGutter();
    showPosition();
    return true;
  }

  // --- project, repository and ref ----------------------------------------------------------
  function filterRepositories() {
    var project = document.getElementById("id_project");
    var repository = document.getElementById("id_repository");
    if (!project || !repository) return;
    Array.from(repository.options).forEach(function (option) {
      if (!option.dataset.project) return;
      option.hidden = Boolean(project.value) && option.dataset.project !== project.value;
    });
    var chosen = repository.selectedOptions[0];
    if (chosen && chosen.hidden) {
      repository.value = "";
      repository.dispatchEvent(new Event("change", { bubbles: true }));
    }
  }

  function repositoryChosen(repository) {
    var project = document.getElementById("id_project");
    var chosen = repository.selectedOptions[0];
    if (project && chosen && chosen.dataset.project && project.value !== chosen.dataset.project) {
      project.value = chosen.dataset.project;
    }
  }

  function fillDefaultRef() {
    var help = document.getElementById("ref-help"), ref = document.getElementById("id_ref");
    if (help && ref && !ref.value && help.dataset.default) ref.value = help.dataset.default;
  }

  // --- wiring -------------------------------------------------------------------------------
  document.addEventListener("click", function (event) {
    var error = event.target.closest("#validation .spec-error[data-line]");
    if (error) {
      event.preventDefault();
      goTo(Number(error.dataset.line), Number(error.dataset.column || 1));
      return;
    }
    var choice = event.target.closest("button[data-template]");
    if (choice && useTemplate(choice.dataset.template)) {
      event.preventDefault();
      var picker = choice.closest("details");
      if (picker) picker.open = false;
    }
  });

  document.addEventListener("input", function (event) {
    if (event.target === editor()) { renderGutter(); showPosition(); }
  });

  document.addEventListener("change", function (event) {
    if (event.target.id === "id_project") filterRepositories();
    if (event.target.id === "id_repository") repositoryChosen(event.target);
  });

  // htmx:load fires on each element htmx swaps in: new validation results or a new ref list.
  document.addEventListener("htmx:load", function (event) {
    if (event.target.id === "ref-help") fillDefaultRef();
    if (event.target.id === "validation") markErrorLines();
  });

  function init() {
    var area = editor();
    if (!area) return;
    area.addEventListener("scroll", function () { gutter().scrollTop = area.scrollTop; });
    ["keyup", "click", "focus"].forEach(function (name) { area.addEventListener(name, showPosition); });
    document.documentElement.classList.add("spec-editor-ready");
    filterRepositories();
    renderGutter();
    markErrorLines();
    fillDefaultRef();
  }

  window.crucibleSpecEditor = { goTo: goTo, offsetOf: offsetOf };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();

// "Copy link" beside a one-time link (an invitation's): copies the text of the element its
// data-copy names. Without JavaScript the button stays hidden and the link is selectable text.
(function () {
  function selectText(node) {
    const range = document.createRange();
    range.selectNodeContents(node);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  function copied(button, ok) {
    const status = button.parentElement.querySelector(".copy-status");
    button.textContent = ok ? "Copied" : "Copy link";
    if (status) status.textContent = ok ? "Link copied to the clipboard." : "Press Ctrl+C (⌘C) to copy the selected link.";
  }
  function copy(button) {
    const source = document.getElementById(button.dataset.copy);
    if (!source) return;
    const text = source.textContent.trim();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { copied(button, true); },
        function () { selectText(source); copied(button, false); });
      return;
    }
    // Plain http on another host has no clipboard API: select the text and ask the browser to copy it.
    selectText(source);
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (error) { ok = false; }
    copied(button, ok);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("button[data-copy]").forEach(function (button) {
      button.hidden = false;
      button.addEventListener("click", function () { copy(button); });
    });
  });
})();

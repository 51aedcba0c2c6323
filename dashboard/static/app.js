// Selection on the queue page: "select all" toggles this page's rows, and
// the bulk buttons stay disabled until something is selected (or the
// "all matching" scope is chosen). The server asks for confirmation
// before anything destructive; this file only helps with the selection.
(function () {
  "use strict";
  function update() {
    var form = document.getElementById("bulk");
    if (!form) return;
    var boxes = form.querySelectorAll('input[name="id"]');
    var n = 0;
    boxes.forEach(function (b) { if (b.checked) n++; });
    var all = document.getElementById("scope-all");
    var nsel = document.getElementById("nsel");
    if (nsel) nsel.textContent = String(n);
    form.querySelectorAll("[data-needs-selection]").forEach(function (b) {
      b.disabled = n === 0 && !(all && all.checked);
    });
  }
  document.addEventListener("change", function (e) {
    var t = e.target;
    if (t && t.id === "selall") {
      document.querySelectorAll('#bulk input[name="id"]').forEach(function (b) { b.checked = t.checked; });
    }
    update();
  });
  document.addEventListener("DOMContentLoaded", update);
})();

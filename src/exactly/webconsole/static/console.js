// Live refresh: fetch the page's content (rendered by the server's templates) and swap it in.
// Abort: a button opens a confirmation dialog; only "Abort" there sends the POST.
(function () {
  "use strict";
  const content = document.getElementById("content");
  const live = document.getElementById("live");
  const flash = document.getElementById("flash");
  const dialog = document.getElementById("confirm");
  const refreshMs = Number(document.body.dataset.refreshMs) || 2000;
  let pending = null;

  async function refresh() {
    try {
      const response = await fetch("fragment", { cache: "no-store" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      content.innerHTML = await response.text();
      live.textContent = "live, updated " + new Date().toLocaleTimeString();
      live.classList.remove("bad");
    } catch (err) {
      live.textContent = "console unreachable: " + err.message;
      live.classList.add("bad");
    }
  }

  function say(text, isError) {
    flash.textContent = text;
    flash.classList.toggle("error", Boolean(isError));
    flash.hidden = false;
  }

  content.addEventListener("click", function (event) {
    const button = event.target.closest("button.abort");
    if (!button) return;
    const d = button.dataset;
    pending = d.kind === "id"
      ? { transactional_id: d.tid }
      : { topic: d.topic, partition: Number(d.partition), producer_id: Number(d.pid) };
    document.getElementById("confirm-text").textContent = "Abort " + d.what + "?";
    dialog.showModal();
  });

  dialog.addEventListener("close", async function () {
    const body = pending;
    pending = null;
    if (dialog.returnValue !== "abort" || body === null) return;
    body.confirm = true;
    say("aborting...", false);
    try {
      const response = await fetch("api/abort", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      const answer = await response.json();
      say(answer.ok ? answer.message : "abort failed: " + answer.error, !answer.ok);
    } catch (err) {
      say("abort failed: " + err.message, true);
    }
    refresh();
  });

  setInterval(refresh, refreshMs);
})();

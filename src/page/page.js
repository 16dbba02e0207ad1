// Keeps the node page current: every few seconds it fetches the page again and swaps in its
// main part, so the server stays the only renderer and the page reads the same without scripts.
"use strict";
(function () {
  const every = Number(document.getElementById("node")?.dataset.refreshMs) || 2000;
  // Says on the page, where the tick's age stands, that what it shows is getting old.
  function stale(why) {
    const age = document.getElementById("age");
    if (age) age.textContent += ` (${why})`;
  }
  async function refresh() {
    try {
      const response = await fetch(location.pathname, { cache: "no-store" });
      if (response.ok) {
        const page = new DOMParser().parseFromString(await response.text(), "text/html");
        const next = page.getElementById("node");
        const current = document.getElementById("node");
        if (next && current) {
          current.replaceWith(document.adoptNode(next));
          document.title = page.title;
        }
      } else {
        stale(`refresh failed: HTTP ${response.status}`);
      }
    } catch (error) {
      stale("refresh failed: exporter unreachable");
    } finally {
      setTimeout(refresh, every);
    }
  }
  setTimeout(refresh, every);
})();

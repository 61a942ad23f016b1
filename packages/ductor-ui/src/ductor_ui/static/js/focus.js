// Live updates redraw parts of a page; a keyboard user focused inside such a part
// keeps focus on the same row and control after the redraw.

export function keepFocus(container, redraw) {
  const active = document.activeElement;
  let key = null;
  let index = -1;
  if (active && container.contains(active)) {
    const row = active.closest("[data-key]");
    key = row ? row.getAttribute("data-key") : null;
    const scope = row || container;
    index = Array.from(scope.querySelectorAll("a, button, input, select, textarea, [tabindex]")).indexOf(active);
  }
  redraw();
  if (index < 0) return;
  let scope = container;
  if (key !== null) {
    scope = Array.from(container.querySelectorAll("[data-key]")).find((el) => el.getAttribute("data-key") === key) || null;
  }
  const target = scope ? scope.querySelectorAll("a, button, input, select, textarea, [tabindex]")[index] : null;
  (target || container).focus?.();
}

// Paging through a cursor-paged list (`{items, next_cursor}`): the cursors seen so
// far are kept, so "Previous page" goes back without the API having to.

import { fill, h } from "./dom.js";
import { keepFocus } from "./focus.js";

export class Pager {
  constructor(onChange, label = "Pages") {
    this.cursors = [null];
    this.index = 0;
    this.next = null;
    this.onChange = onChange;
    this.el = h("nav", { class: "pager", "aria-label": label });
  }

  get cursor() {
    return this.cursors[this.index];
  }

  get first() {
    return this.index === 0;
  }

  reset() {
    this.cursors = [null];
    this.index = 0;
    this.next = null;
  }

  /** Record the page just shown: its `next_cursor` (null when it is the last). */
  shown(nextCursor, count) {
    this.next = nextCursor || null;
    const go = (index) => {
      if (index === this.cursors.length) this.cursors.push(this.next);
      this.index = index;
      this.onChange();
    };
    // A live list redraws its pager with each refresh: a keyboard user on a button keeps it.
    keepFocus(this.el, () =>
      fill(
        this.el,
        h("button", { type: "button", class: "secondary", disabled: this.first, onClick: () => go(0) }, "First page"),
        h("button", { type: "button", class: "secondary", disabled: this.first, onClick: () => go(this.index - 1) }, "Previous page"),
        h("span", { class: "page-no" }, `Page ${this.index + 1}${count !== undefined ? ` · ${count} shown` : ""}`),
        h("button", { type: "button", class: "secondary", disabled: !this.next, onClick: () => go(this.index + 1) }, "Next page"),
      ),
    );
  }
}

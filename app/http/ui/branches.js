// A conversation's branches. The server keeps every turn: each one continues an earlier turn
// (its parent, named by GET /v1/sessions/{id}/messages as the first message's parent_run;
// null for a first turn), so the turns make a tree. Edit and Regenerate add a turn beside the
// one they act on (same parent); the page shows one path from a first turn down, and a turn
// with siblings offers "‹ 2 / 3 ›" to step between them. Stepping to a sibling shows the turns
// after it too: the ones last stepped to below it, else its newest. BranchTree is the tree;
// BranchView shows one branch of it in the conversation's element.

import { TurnView } from "./view.js";

/** ``branch_from`` for a new first turn (an edited first message). */
export const START = "start";

export class BranchTree {
  constructor() {
    this.nodes = new Map(); // run id → {turn, parent, order, view}
    this.count = 0; // turns ever added: the order of the next
    this.chosen = new Map(); // parent run id (null: the first turns) → the child shown last
  }

  /** The tree of stored turns (``turnsFromMessages``, oldest first, each with ``parent``). */
  static fromTurns(turns) {
    const tree = new BranchTree();
    for (const turn of turns) {
      if (turn.runId && !tree.has(turn.runId)) tree.add(turn, turn.parent ?? null);
    }
    tree.chosen.clear(); // a loaded conversation opens on its newest branch
    return tree;
  }

  has(runId) {
    return Boolean(runId) && this.nodes.has(runId);
  }

  get size() {
    return this.nodes.size;
  }

  /** The turn model of ``runId``, and its TurnView once it has one (``view``). */
  node(runId) {
    return this.nodes.get(runId) || null;
  }

  parentOf(runId) {
    return this.nodes.get(runId)?.parent ?? null;
  }

  /** Add ``turn`` (its ``runId`` set) after ``parent``; it becomes the branch shown there. A
   * parent the tree does not hold makes it a first turn. */
  add(turn, parent, view = null) {
    const known = this.has(parent) ? parent : null;
    this.nodes.set(turn.runId, { turn, parent: known, order: this.count++, view });
    this.chosen.set(known, turn.runId);
  }

  /** Forget ``runId`` (a run that ended without storing its turn: it failed). */
  remove(runId) {
    const node = this.nodes.get(runId);
    if (!node) return;
    this.nodes.delete(runId);
    if (this.chosen.get(node.parent) === runId) this.chosen.delete(node.parent);
  }

  /** The run id of the turn stored last: what the server continues by default. */
  get latest() {
    let found = null;
    for (const [runId, node] of this.nodes) {
      if (!found || node.order > this.nodes.get(found).order) found = runId;
    }
    return found;
  }

  /** The turns that continue ``parent`` (null: the first turns), oldest first. */
  children(parent) {
    return [...this.nodes]
      .filter(([, node]) => node.parent === parent)
      .sort(([, a], [, b]) => a.order - b.order)
      .map(([runId]) => runId);
  }

  /** Where ``runId`` stands among its siblings: {index (from 1), count}. */
  position(runId) {
    const siblings = this.children(this.parentOf(runId));
    return { index: siblings.indexOf(runId) + 1, count: siblings.length };
  }

  /** The sibling ``delta`` steps from ``runId`` (null past either end); it becomes the branch
   * shown there. */
  step(runId, delta) {
    const parent = this.parentOf(runId);
    const siblings = this.children(parent);
    const target = siblings[siblings.indexOf(runId) + delta];
    if (!target) return null;
    this.chosen.set(parent, target);
    return target;
  }

  /** The last turn of the branch shown below ``runId``: at each turn, the child stepped to
   * last, else the one whose turns are the newest. */
  leaf(runId) {
    let current = runId;
    for (;;) {
      const children = this.children(current);
      if (!children.length) return current;
      const chosen = this.chosen.get(current);
      current = children.includes(chosen) ? chosen : this.newest(children);
    }
  }

  /** The run ids from a first turn down to ``head`` (null: none; unknown: the latest). */
  path(head) {
    if (head === null || !this.size) return [];
    let current = this.has(head) ? head : this.latest;
    const path = [];
    while (current !== null && !path.includes(current)) {
      path.push(current);
      current = this.parentOf(current);
    }
    return path.reverse();
  }

  /** The path through ``runId`` down to the branch shown below it. */
  pathThrough(runId) {
    return this.path(this.leaf(runId));
  }

  /** What a run that continues ``parent`` (null: none, a first turn) sends as ``branch_from``:
   * nothing where the server would continue it anyway (the latest turn; an empty session). */
  branchFrom(parent) {
    if (parent === null) return this.size ? START : null;
    return parent === this.latest ? null : parent;
  }

  /** Of ``runIds``, the one whose turns (it and those below it) include the newest. */
  newest(runIds) {
    let best = null;
    let bestOrder = -1;
    for (const runId of runIds) {
      const order = this.newestOrder(runId);
      if (order > bestOrder) [best, bestOrder] = [runId, order];
    }
    return best;
  }

  newestOrder(runId) {
    let order = this.nodes.get(runId).order;
    for (const child of this.children(runId)) order = Math.max(order, this.newestOrder(child));
    return order;
  }
}

const runIdOf = (turnEl) => TurnView.of(turnEl)?.turn.runId ?? null;

/** The conversation's element (#log) showing one branch of ``tree`` (a BranchTree, replaced
 * when another conversation opens), with "‹ 2 / 3 ›" on each turn that has siblings. Turns
 * that are no branch (a failed run's, a start's error) stay where they are until the page shows
 * another branch from a turn before them. */
export class BranchView {
  constructor(log) {
    this.log = log;
    this.tree = new BranchTree();
  }

  /** Show ``path`` (run ids from a first turn down): the turns shown from ``from`` (a turn's
   * element; without it, all) give way to the rest of the path. */
  show(path, from = null) {
    const turns = [...this.log.children];
    const start = from ? turns.indexOf(from) : 0;
    for (const el of turns.slice(start)) el.remove();
    const shown = new Set(turns.slice(0, start).map(runIdOf));
    for (const runId of path) {
      if (shown.has(runId)) continue;
      const node = this.tree.node(runId);
      node.view ??= new TurnView(node.turn);
      node.view.el.hidden = false;
      this.log.append(node.view.el);
    }
    this.render();
  }

  /** "‹ 2 / 3 ›" on every turn shown that has siblings, nothing on the others. */
  render() {
    for (const el of this.log.children) {
      const runId = runIdOf(el);
      TurnView.of(el)?.setBranch(this.tree.has(runId) ? this.tree.position(runId) : null);
    }
  }

  /** The run id of the last stored (or live) turn shown: what a new message continues. */
  head() {
    for (const el of [...this.log.children].reverse()) {
      const runId = runIdOf(el);
      if (!el.hidden && this.tree.has(runId)) return runId;
    }
    return null;
  }

  /** The run id of the turn ``turnEl`` continues (null: it is a first turn). */
  parentOf(turnEl) {
    const turn = TurnView.of(turnEl)?.turn;
    if (!turn) return null;
    return this.tree.has(turn.runId) ? this.tree.parentOf(turn.runId) : (turn.parent ?? null);
  }

  /** ``turnEl`` and the turns shown after it. */
  from(turnEl) {
    const turns = [...this.log.children];
    return turns.slice(turns.indexOf(turnEl));
  }

  /** Step from the turn ``turnEl`` to its sibling ``delta`` away and show that branch from
   * there on; its position ({index, count}), or null when there is none to step to. The
   * keyboard stays on the control, now the sibling's. */
  step(turnEl, delta) {
    const runId = runIdOf(turnEl);
    if (!this.tree.has(runId)) return null;
    const target = this.tree.step(runId, delta);
    if (!target) return null;
    this.show(this.tree.pathThrough(target), turnEl);
    const nav = this.tree.node(target).view?.branchEl;
    const same = nav?.querySelector(`[data-action=branch-${delta < 0 ? "prev" : "next"}]`);
    (same && !same.disabled ? same : nav?.querySelector("button:not(:disabled)"))?.focus();
    return this.tree.position(target);
  }
}

"""CORY read by role (docs/results.md, section 2): the pioneer and the observer are roles the two models swap, so a
value is taken iteration by iteration from whichever model held the role then (the records' ``agent_<model>/role``
curves, else the ``swap-every`` schedule), and each role is compared with PPO's single agent on its own."""

import math
from collections.abc import Sequence

from .comparisons import LAST
from .significance import (
    Comparison,
    against_baseline,
)
from .values import (
    Record,
    Value,
    cpu_s,
    ev,
    final,
    ms,
    of,
    of_method,
    seeds,
    slash,
    span,
    v3,
)


def pioneer(r: Record) -> float:
    """The pioneer's greedy eval sentiment (PPO's one model answers the query alone: its pioneer)."""
    return float(r["eval"].get("sentiment_pioneer", r["eval"].get("sentiment", math.nan)))


pioneer.before = lambda r: pioneer({"eval": r["eval_before"]})  # type: ignore[attr-defined]
"""The pioneer's sentiment before training: CORY's pioneer reads PPO's prompt, so the two greedy evaluations
before training are the same episodes (the premise of the paired test)."""


def observer(r: Record) -> float:
    """The observer's greedy eval sentiment; PPO's one model (it has no observer) for a PPO record: the
    observer reads the pioneer's answer, so its episodes are not PPO's (a Welch comparison)."""
    return float(r["eval"].get("sentiment_observer", r["eval"].get("sentiment", math.nan)))


observer.before = lambda r: observer({"eval": r["eval_before"]})  # type: ignore[attr-defined]

ROLES = ("pioneer", "observer")
"""CORY's roles, in the env's order: a model's ``agent_<model>/role`` curve is the index of the role it
played in each iteration."""
MODELS = ("model_0", "model_1")


def role_at(r: Record, model: str, i: int) -> int | None:
    """The role (index into :data:`ROLES`) ``model`` played in the ``i``-th logged iteration of a CORY
    record: its ``agent_<model>/role`` curve, else (a record that did not log it) the swap schedule of its
    ``swap-every`` flag (CORY's ``role_assignment``: model_0 the pioneer in iterations [0, T), the observer
    in [T, 2T), ...); None when neither says."""
    curve = r["curve"]
    logged = curve.get(f"agent_{model}/role")
    if logged is not None and i < len(logged) and math.isfinite(logged[i]):
        return int(logged[i])
    swap = (r.get("flags") or {}).get("swap-every")
    if swap is None or i >= len(curve.get("iteration", [])):
        return None
    swapped = swap > 0 and ((int(curve["iteration"][i]) - 1) // swap) % 2 == 1
    return (1 if swapped else 0) if model == MODELS[0] else (0 if swapped else 1)


def role_window(r: Record, role: str, last: int = LAST) -> list[str | None]:
    """Per iteration of the last ``last``: the model that played ``role`` (None where the record cannot say)."""
    n = len(r["curve"].get("iteration", []))
    index = ROLES.index(role)
    out: list[str | None] = []
    for i in range(max(n - last, 0), n):
        holders = [m for m in MODELS if role_at(r, m, i) == index]
        out.append(holders[0] if len(holders) == 1 else None)
    return out


def role_final(role: str, key: str) -> Value:
    """The mean over the last :data:`LAST` iterations of ``key`` of whichever model played ``role`` in each
    of them (the roles swap: a model's own curve mixes both); PPO's one model (what each role is compared
    with) for a PPO record. NaN where an iteration's role holder is unknown or its value not finite."""
    def value(r: Record) -> float:
        if r["learner"] != "cory":
            return final("agent", key)(r)
        n = len(r["curve"].get("iteration", []))
        window = role_window(r, role)
        picked = [r["curve"][f"agent_{m}/{key}"][n - len(window) + j] if m else math.nan
                  for j, m in enumerate(window)]
        if not picked or not all(math.isfinite(x) for x in picked):
            return math.nan
        return sum(picked) / len(picked)

    return value


def holders(records: Sequence[Record], role: str) -> str:
    """Which model played ``role`` in the last :data:`LAST` iterations: ```model_1` on all 3 seeds`` or seed by
    seed (``model_0 then model_1`` where a swap falls inside the window)."""
    per = {}
    for r in records:
        window = [m or "unknown" for m in role_window(r, role)]
        per[r["seed"]] = " then ".join(f"`{m}`" for m in dict.fromkeys(window)) or "unknown"
    if len(per) == 1:
        return f"{next(iter(per.values()))} on seed {next(iter(per))}"
    if len(set(per.values())) == 1:
        return f"{next(iter(per.values()))} on {of(len(per), len(per))} seeds"
    return ", ".join(f"{m} on seed {s}" for s, m in per.items())


CORY_TESTS: list[Comparison] = [
    Comparison("eval pioneer sentiment", "cory", "ppo", pioneer, "paired"),
    # The observer reads the pioneer's answer: other episodes than PPO's by design (Welch's test).
    Comparison("eval observer sentiment (PPO: its one agent)", "cory", "ppo", observer, "welch"),
    # Training batches are not shared episodes (each learner samples its own responses): Welch's test; the
    # paper's claim on KL is CORY's below PPO's. Each role's value is the model that held it in the window.
    *[Comparison(f"{what} of CORY's {role} vs PPO's, last {LAST} it.", "cory", "ppo", role_final(role, key),
                 "welch", claim)
      for key, what, claim in (("task_reward", "task reward", 1), ("kl", "KL", -1))
      for role in ROLES],
]
"""CORY against PPO by role, each comparison's test declared: the greedy eval of the pioneer paired (the same
reviews, greedy, the same prompt before training), the observer's by Welch's test (it reads the pioneer's
text), the training curves' last iterations by Welch's test, each of the pioneer and the observer as the
role was held in those iterations (the models swap roles every ``--swap-every`` iterations)."""


def reading_cory(records: Sequence[Record]) -> list[str]:
    ppo, cory = of_method(records, "ppo"), of_method(records, "cory")
    out: list[str] = []
    if not (ppo and cory):
        return out
    for key, what in (("task_reward", f"Task reward (training, last {LAST} iterations)"),
                      ("kl", f"KL (nats, last {LAST} iterations)")):
        p = [final("agent", key)(r) for r in ppo]
        cp, co = [role_final("pioneer", key)(r) for r in cory], [role_final("observer", key)(r) for r in cory]
        out.append(f"- **{what}, by the role each CORY model held in those iterations:** PPO {ms(p)} ({slash(p)} on "
                   f"seeds {seeds(ppo)}); CORY's pioneer {ms(cp)} ({slash(cp)}; {holders(cory, 'pioneer')}), its "
                   f"observer {ms(co)} ({slash(co)}; {holders(cory, 'observer')}).")
        if key == "kl":
            shared = [(r, q) for r in cory for q in ppo if r["seed"] == q["seed"]]
            first = [role_final("pioneer", key)(r) - final("agent", key)(q) for r, q in shared]
            second = [role_final("observer", key)(r) - final("agent", key)(q) for r, q in shared]
            out.append(f"  Seed by seed, CORY's pioneer minus PPO: {slash(first, 2)}; its observer minus PPO: "
                       f"{slash(second, 2)}. The paper's \"PPO's KL well above CORY's\" would put both lists below "
                       f"0: the first is below 0 on {sum(1 for x in first if x < 0)} of {len(first)} seeds, the second "
                       f"on {sum(1 for x in second if x < 0)} of {len(second)}.")
    coef = [(r["curve"][f"agent_{m}/kl_coef"][0], r["curve"][f"agent_{m}/kl_coef"][-1])
            for r in records for m in ("agent", "model_0", "model_1") if f"agent_{m}/kl_coef" in r["curve"]]
    if coef:
        flags = ppo[0]["flags"]
        bound = (1 + 0.2 * flags["batch-size"] / flags["kl-horizon"]) ** flags["num-iterations"] - 1
        out.append(f"- **The adaptive KL coefficient:** first {span([a for a, _ in coef])}, last "
                   f"{span([b for _, b in coef])} "
                   f"over all runs; the controller (horizon {flags['kl-horizon']} episodes, {flags['batch-size']} a "
                   f"batch) "
                   f"can move it by at most {bound:.1%} over {flags['num-iterations']} iterations.")
    before = [pioneer({"eval": r["eval_before"]}) for r in ppo]
    pp, cp = [pioneer(r) for r in ppo], [pioneer(r) for r in cory]
    co = [ev("sentiment_observer")(r) for r in cory]
    co_b = [ev("sentiment_observer", "eval_before")(r) for r in cory]
    out.append(f"- **Greedy eval on the same eval reviews** (greedy: \"before\" is one value, {span(before)}): the "
               f"pioneer's sentiment went to {ms(pp)} under PPO ({slash(pp)}) and {ms(cp)} under CORY ({slash(cp)}); "
               f"CORY's observer {span(co_b)} -> {ms(co)} ({slash(co)}).")
    ahead = [c - p for r, c in zip(cory, cp) for q, p in zip(ppo, pp) if r["seed"] == q["seed"]]
    out.append(f"  CORY's pioneer minus PPO's, seed by seed: {slash(ahead)} (ahead on "
               f"{of(sum(1 for x in ahead if x > 0), len(ahead))} seeds).")
    cp_s, pp_s = [cpu_s(r) for r in cory], [cpu_s(r) for r in ppo]
    if all(math.isfinite(x) for x in cp_s + pp_s):
        ratio = (sum(cp_s) / len(cp_s)) / (sum(pp_s) / len(pp_s))
        out.append(f"  Cost: CORY trains two adapters on every batch; its runs took {span(cp_s, 0)} CPU-seconds "
                   f"against PPO's {span(pp_s, 0)}, {ratio:.1f}x on the mean, so this compares the two at unequal "
                   f"compute.")
    base = {r["seed"]: r for r in cory}
    for name, what in (("cory-no-swap", "Without role exchange (`--swap-every 0`)"),
                       ("cory-individual", "With individual rewards (`sentiment/imdb-cory-individual-v0`)")):
        for r in of_method(records, name):
            ref = base.get(r["seed"])
            if ref is None:
                continue
            total, ref_total = ev()(r), ev()(ref)
            word = "above" if total > ref_total else ("below" if total < ref_total else "level with")

            def by_role(x: Record, key: str, digits: int = 3) -> str:
                return slash((role_final(role, key)(x) for role in ROLES), digits)

            out.append(f"- **{what}, seed {r['seed']}** (one run: compare with CORY's seed {r['seed']}, not its mean): "
                       f"greedy eval pioneer {v3(pioneer(r))}, observer {v3(ev('sentiment_observer')(r))} (total "
                       f"{v3(total)}) against CORY's {v3(pioneer(ref))}, {v3(ev('sentiment_observer')(ref))} "
                       f"({v3(ref_total)}): {word} it. By role, pioneer / observer, over the last {LAST} iterations "
                       f"(this run's pioneer {holders([r], 'pioneer')}, CORY's {holders([ref], 'pioneer')}): "
                       f"training task reward {by_role(r, 'task_reward')} against {by_role(ref, 'task_reward')}; "
                       f"KL {by_role(r, 'kl', 2)} against {by_role(ref, 'kl', 2)}.")
    return out + against_baseline(records, CORY_TESTS)

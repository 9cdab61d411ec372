"""What docs/results.md says about each section's records: the sentences of its reading, each computed
from the records; where the records cannot support a claim, the function does not write it. Each
section's comparisons (:data:`SECTION_TESTS`: its tests table, one family for the one correction) and
its reading (:data:`READINGS`).

The pieces a section's reading is made of live below it: :mod:`values` (a record's values,
formatted), :mod:`provenance` (each run once, machines, samplers, the shared flags) and
:mod:`significance` (the declared tests, the premise of pairing, the one correction, the readings). A new
comparison's section reuses them: :func:`~significance.against` builds its "each method against a
baseline" comparisons (one entry of :data:`SECTION_TESTS` gives the section its tests table and, without a
:data:`READINGS` entry of its own, the reading :func:`~significance.against_baseline`). The page
then needs the section's markers: ``<comparison>``, ``<comparison>-settings`` and ``<comparison>-reading``
(``render`` names any that is missing)."""

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .comparisons import CODING_SWEEP_RATES, SWEEP_RATES, SWEEPS, method, sweep_name
from .provenance import distinct_runs, row_note
from .records import chosen_rate, edge_note
from .roles import CORY_TESTS, pioneer, reading_cory
from .roles import ROLES as ROLES
from .roles import holders as holders
from .roles import observer as observer
from .roles import role_at as role_at
from .roles import role_final as role_final
from .roles import role_window as role_window
from .significance import (
    LEVEL,
    POWER,
    Comparison,
    against,
    against_baseline,
    budget,
    caveats,
    family_tests,
    reading_of,
)
from .summary import mean_std
from .values import (
    Record,
    Value,
    cpu_line,
    cpu_s,
    ev,
    first_iteration,
    method_label,
    moving_average,
    ms,
    of,
    of_method,
    seeds,
    slash,
    span,
    v3,
    window,
)


def _moved(before: Sequence[float], after: Sequence[float]) -> int:
    return sum(1 for b, a in zip(before, after) if a > b)


def reading_magrpo(records: Sequence[Record], smoothing: int) -> list[str]:
    team, untrained, sequential = (of_method(records, n)
                                   for n in ("magrpo", "untrained-parallel", "untrained-sequential"))
    strict, reference, turns = (of_method(records, n) for n in ("single-strict", "single-reference", "magrpo-2turn"))
    out: list[str] = []
    if team:
        before, after = [ev(split="eval_before")(r) for r in team], [ev()(r) for r in team]
        out.append(f"- **MAGRPO: eval joint reward {ms(before)} -> {ms(after)}** (seeds {seeds(team)}: "
                   + ", ".join(f"{v3(b)} -> {v3(a)}" for b, a in zip(before, after))
                   + f"), higher after training on {of(_moved(before, after), len(team))} seeds, each scored on the "
                   "same eval articles and sampling seed before and after.")
        moved = []
        for key in ("length", "diversity", "transition", "jaccard"):
            b, a = [ev(key, "eval_before")(r) for r in team], [ev(key)(r) for r in team]
            moved.append(f"{key} {v3(sum(b) / len(b), 2)} -> {v3(sum(a) / len(a), 2)} (up on "
                         f"{of(_moved(b, a), len(team))} seeds)")
        out.append("  Components, means over the seeds: " + "; ".join(moved) + ".")
        half = max(r["curve"]["iteration"][-1] for r in team) // 2 + 1 if team[0]["curve"].get("iteration") else None
        if half is not None:
            parts = []
            for r in team:
                avg = moving_average(r["curve"]["reward/total"], smoothing)
                late = [a for it, a in zip(r["curve"]["iteration"], avg) if it >= half]
                raw = r["curve"]["reward/total"]
                parts.append(f"seed {r['seed']}: {v3(avg[0], 2)} at the first iteration, {span(late, 2)} over "
                             f"iterations {half:.0f}-{r['curve']['iteration'][-1]:.0f}, single batches {span(raw, 2)}")
            out.append(f"  Training batch joint reward, moving average of {smoothing}: " + "; ".join(parts) + ".")
        if untrained:
            u = [ev()(r) for r in untrained]
            spread = mean_std(u)
            if spread.std > 0:
                out.append(f"  The untrained pair scores {ms(u)}: the trained pair's mean is "
                           f"{(sum(after) / len(after) - spread.mean) / spread.std:.1f} of its standard deviations "
                           f"above it.")
            same = [(r["seed"], ev()(r), ev(split="eval_before")(t))
                    for r in untrained for t in team if t["seed"] == r["seed"]]
            equal = [s for s, a, b in same if abs(a - b) < 5e-5]
            out.append(f"- **Consistency check:** the untrained-pair record (`llm-envs eval`, the same sampling "
                       f"settings "
                       f"and seed) equals the MAGRPO run's own eval before training (to 4 decimals) on "
                       f"{of(len(equal), len(same))} shared seeds"
                       + (f" ({', '.join(f'seed {s}: {a:.4f} vs {b:.4f}' for s, a, b in same if s not in equal)})"
                          if len(equal) < len(same) else f" ({slash((a for _, a, _ in same), 4)})")
                       + ": the baseline and the trained method are scored on the same episodes where they agree.")
    if untrained and sequential:
        p, s = [ev()(r) for r in untrained], [ev()(r) for r in sequential]
        lp, ls = [ev("length")(r) for r in untrained], [ev("length")(r) for r in sequential]
        below = sum(1 for a, b in zip(s, p) if a < b)
        out.append(f"- **The sequential protocol against the parallel one, untrained:** {ms(s)} against {ms(p)} "
                   f"({slash(s)} against {slash(p)}, seeds {seeds(sequential)}), below on {of(below, len(s))} seeds; "
                   f"the length component {v3(sum(ls) / len(ls), 2)} against {v3(sum(lp) / len(lp), 2)}.")
    if strict:
        totals = [ev()(r) for r in strict]
        paying = [(r["seed"], first_iteration(r, "reward/total", lambda x: x > 0)) for r in strict]
        lines = [f"- **Single agent, `split=strict`:** eval {ms(totals)} ({slash(totals)}, seeds {seeds(strict)}); a "
                 "response without `[PARAGRAPH_SPLIT]` scores 0, so a group pays only once a sample holds the "
                 "delimiter and passes the first level."]
        lines.append("  First training iteration with a non-zero joint reward: "
                     + ", ".join(f"seed {s}: {it if it is not None else 'none in the run'}" for s, it in paying) + ".")
        for r in strict:
            if not any(x > 0 for x in r["curve"].get("reward/total", [])):
                share = max(r["curve"].get("reward/delimiter", [math.nan]))
                batch = r["flags"]["num-problems"] * r["flags"]["num-generations"]
                lines.append(f"  Seed {r['seed']}: every training reward was 0, so every advantage was 0 (eval "
                             f"{v3(ev()(r))}); its largest share of training responses with the delimiter was "
                             f"{v3(share)} ({share * batch:.0f} of {batch}).")
        learned = [r for r in strict if any(x > 0 for x in r["curve"].get("reward/total", []))]
        if learned:
            lines.append(f"  Where GRPO got a signal (seeds {seeds(learned)}): eval delimiter share "
                         f"{slash(ev('delimiter')(r) for r in learned)}, eval length component "
                         f"{slash(ev('length')(r) for r in learned)}.")
        out += lines
    if reference:
        before, after = [ev(split="eval_before")(r) for r in reference], [ev()(r) for r in reference]
        out.append(f"- **Single agent, `split=reference`:** eval {ms(before)} -> {ms(after)}.")
        if untrained and sequential:
            b = sum(before) / len(before)
            out.append(f"  Untrained, it scores {b / (sum(ev()(r) for r in untrained) / len(untrained)):.1f}x the "
                       f"untrained parallel pair and {b / (sum(ev()(r) for r in sequential) / len(sequential)):.1f}x "
                       "the sequential one.")
        delim = [max(r["curve"].get("reward/delimiter", [math.nan])) for r in reference]
        marker = [max(r["curve"].get("reward/marker", [math.nan])) for r in reference]
        out.append(f"  Eval delimiter share after training {slash(ev('delimiter')(r) for r in reference)}, before "
                   f"{slash(ev('delimiter', 'eval_before')(r) for r in reference)}; the largest training share with "
                   f"the "
                   f"delimiter {slash(delim)}, with a `Paragraph 2:` label {slash(marker)} (seeds {seeds(reference)}).")
        out.append(f"  Eval `length` component before {slash(ev('length', 'eval_before')(r) for r in reference)}, "
                   f"after "
                   f"{slash(ev('length')(r) for r in reference)}: without a delimiter or a label the reference's last "
                   "fallback cuts the response at one third of its characters, which puts the two parts in the "
                   "length band for most texts.")
        if team:
            tested = next(t for t in family_tests(records, SECTION_TESTS["magrpo"]) if t.b == "single-reference")
            out.append(f"  Against MAGRPO's {ms([ev()(r) for r in team])}: {reading_of(tested)}. "
                       "This baseline measures "
                       "one text cut at a fixed ratio more than a single model writing two parts; `strict` is the "
                       "comparison that asks for the format.")
    if turns:
        second_b, second_a = [ev(split="eval_before")(r) for r in turns], [ev()(r) for r in turns]
        ret_b, ret_a = [ev("return", "eval_before")(r) for r in turns], [ev("return")(r) for r in turns]
        first_b = [r - s for r, s in zip(ret_b, second_b)]
        first_a = [r - s for r, s in zip(ret_a, second_a)]
        out.append(f"- **MAGRPO with 2 turns (env feedback):** the eval total is the second turn's reward, "
                   f"{ms(second_b)} "
                   f"-> {ms(second_a)}; the return over both turns {ms(ret_b)} -> {ms(ret_a)}, so the first turn "
                   f"{ms(first_b)} -> {ms(first_a)}.")
        below_b = sum(1 for s, f in zip(second_b, first_b) if s < f)
        below_a = sum(1 for s, f in zip(second_a, first_a) if s < f)
        out.append(f"  The second turn, which sees its first answer and the env's feedback, scores below the first on "
                   f"{of(below_b, len(turns))} seeds untrained ({slash(second_b)} against {slash(first_b)}) and "
                   f"{of(below_a, len(turns))} trained ({slash(second_a)} against {slash(first_a)}).")
        if team:
            out.append(f"  The trained first turn against single-turn MAGRPO: {ms(first_a)} against "
                       f"{ms([ev()(r) for r in team])} (seed by seed {slash(first_a)} against "
                       f"{slash(ev()(r) for r in team)}).")
    return out + against_baseline(records, SECTION_TESTS["magrpo"])


def reading_preference(records: Sequence[Record]) -> list[str]:
    team, central, madpo = (of_method(records, n) for n in ("magrpo", "centralized", "madpo"))
    out: list[str] = []
    if team:
        out.append(f"- **MAGRPO team:** {ms([ev(split='eval_before')(r) for r in team])} -> "
                   f"{ms([ev()(r) for r in team])} ({span([ev()(r) for r in team])} after).")
    if central:
        totals = [x for r in central for x in r["curve"].get("reward/total", [])]
        found = [(r["seed"], max(r["curve"].get("reward/sections_found", [math.nan]))) for r in central]
        out.append(f"- **Centralised single model:** eval {slash(ev(split='eval_before')(r) for r in central)} before, "
                   f"{slash(ev()(r) for r in central)} after (seeds {seeds(central)}); eval `sections_found` "
                   f"{ms([ev('sections_found')(r) for r in central])}; the largest share of a training batch's roles "
                   f"with a tagged section {', '.join(f'{v3(x)} (seed {s})' for s, x in found)}.")
        if totals and all(x == 0 for x in totals):
            out.append(f"  Every training batch's joint reward was 0 ({len(totals)} iterations over the seeds), so "
                       f"every "
                       "group's advantage was 0 and MAGRPO had nothing to learn from: the reference's format on this "
                       "model, not a bug of the wrapper ([docs/centralized.md](centralized.md)).")
    costs = {n: [cpu_s(r) for r in of_method(records, n)] for n in ("magrpo", "centralized", "madpo")}
    parts = []
    for n, xs in costs.items():
        known = [x for x in xs if math.isfinite(x)]
        if xs:
            parts.append(f"{method_label(records, n)} {span(known, 0) if known else 'unknown'}"
                         + (f" ({len(xs) - len(known)} unknown)" if len(known) < len(xs) else ""))
    out.append("- **Cost**, CPU-seconds a run: " + "; ".join(parts) + ".")
    if madpo:
        before, after = [ev(split="eval_before")(r) for r in madpo], [ev()(r) for r in madpo]
        loss = [r["curve"].get("losses/dpo", [math.nan])[-1] for r in madpo]
        acc = [r["curve"].get("pref/accuracy", [math.nan])[-1] for r in madpo]
        margin = [r["curve"].get("pref/margin", [math.nan])[-1] for r in madpo]
        out.append(f"- **MADPO:** {ms(before)} -> {ms(after)} (seeds {seeds(madpo)}: "
                   + ", ".join(f"{v3(b)} -> {v3(a)}" for b, a in zip(before, after))
                   + f"; below its own start on {of(sum(1 for b, a in zip(before, after) if a < b), len(madpo))}). "
                   f"Its last update's DPO loss {slash(loss, 2)} (chance: ln 2 = 0.69), pair accuracy {slash(acc, 2)}, "
                   "margin "
                   f"{slash(margin, 0)} nats: it fits its pairs at the learning rate every method shares here "
                   f"({madpo[0]['flags'].get('learning-rate')}); section 4 gives it its own."
                   + (f" The records cannot separate the rate from where the runs ran: {note}." if
                      (note := row_note(madpo)) else ""))
    return out + against_baseline(records, SECTION_TESTS["preference"])


def sweep_line(sweep: Sequence[Record], name: str, chosen: float | None,
               rates: Sequence[float] | None = None, note: str | None = None) -> str:
    """``validation v1 at r1, **v2 at r2**, ...; eval (not used to choose): ...`` of one method's sweep
    (``rates``: its grid, default ``SWEEP_RATES[name]``), and ``note`` (its rate at an edge of its grid,
    ``records.edge_note``)."""
    found = [(rate, next((r for r in sweep if r["method"] == sweep_name(name, rate)), None))
             for rate in (SWEEP_RATES[name] if rates is None else rates)]
    val = ", ".join((f"**{v3(ev(split='validation')(r))} at {rate:g}**" if rate == chosen
                     else f"{v3(ev(split='validation')(r))} at {rate:g}") if r else f"(missing) at {rate:g}"
                    for rate, r in found)
    evals = ", ".join(v3(ev()(r)) for _, r in found if r)
    before = span([ev(split="eval_before")(r) for _, r in found if r])
    return f"validation totals {val}; eval (not used to choose) {before} -> {evals}" + (f"; {note}" if note else "")


def reading_methods(records: Sequence[Record], sweep: Sequence[Record], section3: Sequence[Record],
                    out_dir: Path) -> list[str]:
    out: list[str] = []
    if records:
        out.append("- " + cpu_line(records))
    rates = {name: chosen_rate(out_dir, name) for name in SWEEP_RATES}
    notes = {name: note for name in SWEEP_RATES if (note := edge_note(out_dir, name))}

    def at(name: str) -> str:
        mine = of_method(records, name)
        if not mine:
            return "no record yet"
        after = [ev()(r) for r in mine]
        before = ms([ev(split="eval_before")(r) for r in mine])
        return f"eval {before} -> **{ms(after)}** ({slash(after)}, seeds {seeds(mine)})"

    def rec(name: str, rate: float) -> Record | None:
        return next((r for r in sweep if r["method"] == sweep_name(name, rate)), None)

    out.append(f"- **MAGRPO team**: {sweep_line(sweep, 'magrpo', rates['magrpo'], note=notes.get('magrpo'))}. "
               f"At {rates['magrpo']}: "
               f"{at('magrpo')}.")
    if rates["madpo"] is not None:
        losses = ", ".join(f"{v3(r['curve']['losses/dpo'][-1], 2)} at {rate:g}" for rate in SWEEP_RATES["madpo"]
                           if (r := rec("madpo", rate)) and r["curve"].get("losses/dpo"))
        old = [r["curve"]["losses/dpo"][-1] for r in of_method(section3, "madpo") if r["curve"].get("losses/dpo")]
        out.append(f"- **Offline MADPO**: {sweep_line(sweep, 'madpo', rates['madpo'], note=notes.get('madpo'))}. "
                   f"Its last DPO loss {losses}"
                   + (f" (section 3's rate, {of_method(section3, 'madpo')[0]['flags'].get('learning-rate')}: "
                      f"{span(old, 2)})" if old else "")
                   + f". At {rates['madpo']}: {at('madpo')}.")
    name = "madpo-iterative"
    if rates[name] is not None:
        chosen = rates[name]
        out.append(f"- **Iterative MADPO**: {sweep_line(sweep, name, chosen, note=notes.get(name))}.")
        loss = [(r["seed"], r["curve"].get("losses/dpo", [])) for r in of_method(records, name)]
        out.append(f"  At {chosen:g} its DPO loss over the updates: " + ", ".join(
            f"seed {s} {span(c, 2)} (last {slash(c[-3:], 2)})" for s, c in loss if c) + " (chance: ln 2 = 0.69).")
        above = [rate for rate in SWEEP_RATES[name] if rate > chosen and rec(name, rate)]
        for rate in above:
            r = rec(name, rate)
            out.append(f"  At {rate:g}: DPO loss {span(r['curve'].get('losses/dpo', [math.nan]), 2)}; validation "
                       f"`jaccard` "
                       f"{v3(ev('jaccard', 'validation')(r), 2)} against "
                       f"{v3(ev('jaccard', 'validation')(rec(name, chosen)), 2)} at "
                       f"{chosen:g}, length {v3(ev('length', 'validation')(r), 2)} against "
                       f"{v3(ev('length', 'validation')(rec(name, chosen)), 2)}.")
        out.append(f"  At {chosen:g}: {at(name)}.")
    marlhf = of_method(records, "marlhf")
    if marlhf:
        def last(r: Record, key: str) -> float:
            return float(r["curve"].get(key, [math.nan])[-1])

        interval = [1.96 * math.sqrt(acc * (1 - acc) / last(r, "pref/rm_heldout_pairs"))
                    for r in marlhf if math.isfinite(acc := last(r, "pref/rm_heldout_accuracy"))] or [math.nan]
        out.append(f"- **MARLHF's reward model on held-out pairs:** accuracy "
                   f"{slash(last(r, 'pref/rm_heldout_accuracy') for r in marlhf)} "
                   f"on {slash((last(r, 'pref/rm_heldout_pairs') for r in marlhf), 0)} pairs (seeds {seeds(marlhf)}; "
                   f"{slash(last(r, 'pref/rm_accuracy_before') for r in marlhf)} before training, validation chose "
                   f"epoch "
                   f"{slash((last(r, 'pref/rm_epoch') for r in marlhf), 0)}). On so few pairs one accuracy's "
                   f"binomial 95% interval (normal approximation) is up to ±{v3(max(interval), 2)}.")
        if rates["marlhf"] is not None:
            out.append(f"  MAGRPO on that reward: "
                       f"{sweep_line(sweep, 'marlhf', rates['marlhf'], note=notes.get('marlhf'))}. At "
                       f"{rates['marlhf']}: {at('marlhf')}.")
            for rate in SWEEP_RATES["marlhf"]:
                r = rec("marlhf", rate)
                if r is None or rate == rates["marlhf"] or not r["curve"].get("iteration"):
                    continue
                half = int(r["curve"]["iteration"][-1]) // 2 + 1
                out.append(f"  At {rate:g}, iterations {half}-{int(r['curve']['iteration'][-1])}: learned reward "
                           f"{span(window(r, 'pref/learned_reward', half), 1)}, the task's reward of the same batches "
                           f"{span(window(r, 'reward/total', half), 2)}.")
            out.append("  These runs use no KL penalty (the reference's MARLHF puts 0.1 on the reward, `--kl-coef 0.1 "
                       "--kl-in reward`); every method of this section runs without one.")
    central = of_method(records, "centralized")
    if central:
        totals = [x for r in central for x in r["curve"].get("reward/total", [])]
        found = [max(r["curve"].get("reward/sections_found", [math.nan])) for r in central]
        out.append(f"- **Centralised, reference format** (not swept: {chosen_rate(out_dir, 'centralized')}): "
                   f"{at('centralized')}; eval before {slash(ev(split='eval_before')(r) for r in central)}. "
                   f"The largest share of a training batch's roles with a tagged section: {slash(found)} (seeds "
                   f"{seeds(central)})"
                   + ("; every training joint reward was 0, so every advantage was 0 and the adapter never moved."
                      if totals and all(x == 0 for x in totals) else "."))
    name = "centralized-prefill"
    prefill = of_method(records, name)
    if rates[name] is not None and prefill:
        out.append(f"- **Centralised, first tag prefilled**: "
                   f"{sweep_line(sweep, name, rates[name], note=notes.get(name))}.")
        out.append(f"  Eval `sections_found` {slash(ev('sections_found', 'eval_before')(r) for r in prefill)} before, "
                   f"{slash(ev('sections_found')(r) for r in prefill)} after (seeds {seeds(prefill)}); `length` after "
                   f"{slash(ev('length')(r) for r in prefill)}. At {rates[name]}: {at(name)}.")
        for rate in SWEEP_RATES[name]:
            r = rec(name, rate)
            if r is None or rate == rates[name] or not r["curve"].get("reward/sections_found"):
                continue
            curve = r["curve"]["reward/sections_found"]
            peak = max(curve)
            out.append(f"  At {rate:g}: training `sections_found` peaks at {v3(peak, 2)} (iteration "
                       f"{first_iteration(r, 'reward/sections_found', lambda x, p=peak: x == p)}) and ends at "
                       f"{v3(curve[-1], 2)}; eval total {v3(ev()(r))}.")
    return out + against_baseline(records, SECTION_TESTS["methods"], notes)


CODING_MEASURES = (("eval pass@1", ev("pass@1")), ("eval tests", ev("tests")))


"""What the coding section compares: pass@1 and the fraction of assertions passed, the two measures the
one coder (no helper, so no aux levels) and the pair are scored by alike."""


CODING_TESTS: list[Comparison] = [
    *(c for what, value in CODING_MEASURES
      for c in [*against("magrpo", ["untrained-parallel"], what, value, "paired"),
                *against("magrpo", ["untrained-sequential", "single"], what, value, "welch")]),
    *(Comparison(what, "magrpo-2turn", "magrpo", value, "welch") for what, value in CODING_MEASURES),
]


"""The paper's claims on code (issue #51): the MAGRPO pair above the untrained pairs and the one coder,
and two turns with the tests' feedback above one turn; on each measure of :data:`CODING_MEASURES`. Paired
against the untrained parallel pair (the same env, eval problems and sampling seed: the pair before
training); by Welch's test against rows that play other episodes by design (the sequential protocol, the
one coder's own env, the second turn's eval)."""


def reading_coding(records: Sequence[Record], sweep: Sequence[Record], out_dir: Path) -> list[str]:
    """Section 5: the sweep, the untrained pairs' components, each row's eval before and after, and the
    paper's direction on each comparison, with the tests of :data:`CODING_TESTS`."""
    out: list[str] = []
    runs = [*records, *sweep]
    if runs:
        out.append("- " + cpu_line(list(distinct_runs(runs).values())))
    for name in ("untrained-parallel", "untrained-sequential"):
        mine = of_method(records, name)
        if mine:
            shown = ", ".join(f"`{k}` {ms([ev(k)(r) for r in mine])}"
                              for k in ("pass@1", "tests", "main_defined", "aux_defined", "syntax", "aux_call",
                                        "beyond_wrapper"))
            out.append(f"- **{method('coding', name).label}** (eval, seeds {seeds(mine)}): {shown}.")
    for name, rates in CODING_SWEEP_RATES.items():
        rate = chosen_rate(out_dir, name, "coding")
        if not any(r["method"] == sweep_name(name, x) for r in sweep for x in rates):
            grid = ", ".join(f"{x:g}" for x in rates)
            out.append(f"- **{method('coding', name).label}**: no sweep record yet (rates {grid}).")
            continue
        line = (f"- **{method('coding', name).label}**: "
                f"{sweep_line(sweep, name, rate, rates, note=edge_note(out_dir, name, 'coding'))}.")
        mine = of_method(records, name)
        if mine:
            parts = []
            for key in ("pass@1", "tests", "total"):
                before, after = [ev(key, "eval_before")(r) for r in mine], [ev(key)(r) for r in mine]
                parts.append(f"`{key}` {ms(before)} -> **{ms(after)}** ({slash(after)})")
            line += f" At {rate}, seeds {seeds(mine)}: eval " + "; ".join(parts) + "."
        out.append(line)
    notes = {name: note for name in CODING_SWEEP_RATES if (note := edge_note(out_dir, name, "coding"))}
    validation = [float(r.get("validation", {}).get("pass@1", math.nan)) for r in sweep]
    if validation and all(x == 0 for x in validation):
        out.append(f"- **What chose the rates:** validation `pass@1` is {v3(0.0)} in every one of the {len(sweep)} "
                   "sweep runs, so each rate was chosen on the other components of the total (format, definitions, "
                   "syntax, the fraction of assertions passed), not on solved problems.")
    for t in family_tests(records, CODING_TESTS):
        label_a, label_b = method("coding", t.a).label, method("coding", t.b).label
        means = (f"{ms(list(t.values_a.values()))} against {ms(list(t.values_b.values()))}; "
                 if t.values_a and t.values_b else "")
        out.append(f"- **The paper's claim, {label_a} above {label_b}** ({t.what}): {means}{reading_of(t)}."
                   f"{caveats(records, t, notes)}")
    out += power_lines(records, out_dir)
    out.append("- **Not measured here:** the paper's discussion baseline (the agents exchange messages before "
               "writing), which this suite has no env for.")
    return out


POWER_PROBLEMS = (1, 2, 4)
"""The plausible effects a coding budget is sized for: this many more eval problems solved (pass@1) or this
share of the assertions (tests), out of the eval's problems."""


def power_lines(records: Sequence[Record], out_dir: Path) -> list[str]:
    """Section 5's budget statement, from the observed spread over seeds: for each paper's claim on pass@1
    and on the tests passed (:data:`CODING_TESTS`), by its test as used, at the section's Bonferroni level,
    the power its seeds have to detect an effect of :data:`POWER_PROBLEMS` problems of the eval's and the
    seeds a side it would need for 80% power (``stats.seeds_needed``); and, assuming the spread over seeds
    is the eval's sampling of problems (so that it shrinks as one over the square root of their number), the
    eval problems that many seeds would stand for at the seeds run now."""
    tested = [t for t in family_tests(records, CODING_TESTS) if t.test.defined]
    if not tested:
        return []
    problems = next((int(r["flags"]["num-eval-problems"]) for r in records
                     if "num-eval-problems" in r.get("flags", {})), None)
    if problems is None:
        return []
    effects = [k / problems for k in POWER_PROBLEMS]
    out = [f"- **The budget a claim would need** (the observed spread over seeds; each comparison by the test it "
           f"used, at the section's Bonferroni level {LEVEL:g} / {tested[0].m}, for {POWER:.0%} power; an effect of "
           + ", ".join(f"{k} problem{'s' if k > 1 else ''} of the {problems} ({v3(x)})"
                       for k, x in zip(POWER_PROBLEMS, effects))
           + "; on `tests`, the same shares of the assertions). In brackets, if the spread over seeds is the eval's "
             "sampling of problems (shrinking as the square root of their number), about as many eval problems at "
             "the seeds run now:"]
    for t in tested:
        n = min(len(t.values_a), len(t.values_b))
        rows = budget(t, effects)
        parts = []
        for x, now, need in rows:
            seeds_text = "beyond reach" if need is None else f"{need} seeds a side"
            stand = "" if need is None else f" ({math.ceil(problems * need / n)} problems at {n} seeds)"
            parts.append(f"{v3(x)}: power {now:.0%} now, {seeds_text}{stand}")
        out.append(f"  {method_label(records, t.a)} - {method_label(records, t.b)} ({t.what}, {t.used}): "
                   + "; ".join(parts) + ".")
    return out


SECTION_TESTS: dict[str, list[Comparison]] = {
    "magrpo": [*against("magrpo", ["untrained-parallel"], test="paired"),
               *against("magrpo", ["untrained-sequential", "single-reference", "single-strict", "magrpo-2turn"],
                        test="welch")],
    "cory": CORY_TESTS,
    "preference": [*against("magrpo", ["centralized"], test="welch"), *against("magrpo", ["madpo"], test="paired")],
    "methods": [*against("magrpo", ["madpo-iterative", "madpo", "marlhf"], test="paired"),
                *against("magrpo", ["centralized-prefill", "centralized"], test="welch")],
    "coding": CODING_TESTS,
}


"""Each section's comparisons, each with its declared test, tested in its table (one family for the
section's one correction) and read by :func:`against_baseline`; a new section adds its entry
(``against(baseline, others, test=...)``). Declared paired: rows of the same env and eval settings, whose
untrained evaluations are the same episodes (the premise, checked on the records, can still send a
comparison to Welch's test); declared Welch: rows that play other episodes by design (another protocol or
env, the single agent's prompts, a second turn's eval, a centralised model's prompts)."""


SECTION_EFFECTS: dict[str, list[tuple[str, Value]]] = {
    "magrpo": [("eval total", ev())],
    "cory": [("eval pioneer sentiment", pioneer), ("eval observer sentiment", ev("sentiment_observer"))],
    "preference": [("eval total", ev())],
    "methods": [("eval total", ev())],
    "coding": [("eval pass@1", ev("pass@1")), ("eval tests", ev("tests")), ("eval total", ev())],
}
"""The measures each section's table shows every trained row's training effect on (after minus before on
the same evaluation, ``significance.effects_table``), beside its comparisons between rows."""


Records = Sequence[Record]


READINGS: dict[str, Callable[[Mapping[str, Records], Path, int], list[str]]] = {
    "magrpo": lambda of, out, smoothing: reading_magrpo(of["magrpo"], smoothing),
    "cory": lambda of, out, smoothing: reading_cory(of["cory"]),
    "preference": lambda of, out, smoothing: reading_preference(of["preference"]),
    "methods": lambda of, out, smoothing: reading_methods(of["methods"], of.get("sweep", []), of.get("preference", []),
                                                         out),
    "coding": lambda of, out, smoothing: reading_coding(of["coding"], of.get("coding-sweep", []), out),
}


"""Each section's own reading, from the records of every comparison (by name), the records' folder and
the figures' smoothing. A section with tests (``SECTION_TESTS``) and no entry here reads
:func:`against_baseline`; one with neither has no reading (the sweep, read in ``methods``'s)."""


def reading(comparison: str, records_of: Mapping[str, Records], out: Path, smoothing: int) -> str | None:
    """The reading of one section, from the records (None: the section has no reading; the page then
    needs no ``<comparison>-reading`` markers)."""
    records = records_of[comparison]
    if comparison in READINGS:
        lines = READINGS[comparison](records_of, out, smoothing)
    elif comparison in SECTION_TESTS:
        lines = against_baseline(records, SECTION_TESTS[comparison])
    else:
        return None
    sweep = SWEEPS[comparison][0] if comparison in SWEEPS else None
    if not records and not (sweep and records_of.get(sweep)):
        return "No record yet."
    return "\n".join(lines)

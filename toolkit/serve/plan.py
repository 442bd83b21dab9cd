"""What `tk serve` serves, planned from its model arguments before any model loads: the pairs each DIR[:SOURCE-TARGET]
translates (a multilingual model's own codes for each), and the pair a request naming none gets. The CLI and
`tk serve --ray` plan alike."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.core.errors import UsageError


@dataclass(frozen=True)
class Planned:
    """One DIR[:SOURCE-TARGET] of tk serve: the pairs it serves (clients' codes), and for a multilingual model the
    model's codes of each (fills: every pair of its languages, after the pairs other models state)."""

    argument: str
    directory: str
    pairs: tuple[tuple[str, str], ...]
    declared: object  # its TokenizerDeclaration
    codes: dict | None = None
    fills: bool = False

    def shown(self) -> str:
        if self.fills:
            return f"any two of {len({c for pair in self.pairs for c in pair})} languages"
        return "/".join(map("-".join, self.pairs))


def plan_models(arguments: tuple[str, ...]) -> list[Planned]:
    """What each model argument serves, read from its manifest before any model loads; two models stating one pair
    are a one-line error (a multilingual model's every-pair yields to a stated pair instead)."""
    from toolkit.core import manifest as manifest_mod
    from toolkit.serve import languages

    wanted: dict[tuple[str, str], str] = {}
    planned = []
    for argument in arguments:
        directory, pair = languages.split_argument(argument)
        problem = languages.malformed_pair(argument) if pair is None else None
        if problem:
            raise UsageError(problem)
        m = manifest_mod.load(directory)
        declared = m.declared().tokenizer
        codes, fills = None, False
        if declared.languages is not None:  # multilingual: its own codes for each pair asked for
            every = languages.every_pair(declared)
            if pair is None:
                codes, fills = every, True
            elif pair in every:
                codes = {pair: every[pair]}
            else:
                raise UsageError(f"{argument}: this model does not translate {languages.shown(pair)}; its codes: "
                                 f"{', '.join(sorted({c for p in every for c in p}))}")
            pairs = tuple(codes)
        else:
            pairs = (pair or languages.stated_pair(declared) or languages.default_pair(m.declared().origin, directory),)
        for p in pairs if not fills else ():
            if p in wanted:
                raise UsageError(f"{argument} and {wanted[p]} both translate {languages.shown(p)}; serve one model per language pair")
            wanted[p] = argument
        planned.append(Planned(argument, directory, pairs, declared, codes, fills))
    return planned


def default_pair(planned: list[Planned], source_lang: str | None, target_lang: str | None) -> tuple[str, str] | None:
    """--source-lang/--target-lang as the served pair a request naming none gets (None: the first model's first pair).
    A code is the clients' (en) or a model's own (eng_Latn, __en__); one no model knows is one line listing the codes."""
    from toolkit.serve import languages

    if source_lang is None and target_lang is None:
        return None
    first = planned[0].pairs[0]
    pair = tuple(_served_code(planned, code, side) if code is not None else fallback
                 for code, side, fallback in ((source_lang, "source", first[0]), (target_lang, "target", first[1])))
    served = {p for plan in planned for p in plan.pairs}
    if pair not in served:
        raise UsageError(f"--source-lang/--target-lang: {languages.shown(pair)} is not a served pair; "
                         f"served: {', '.join(sorted({c for p in served for c in p}))} as source and target")
    return pair


def _served_code(planned: list[Planned], code: str, side: str) -> str:
    """The clients' code of what was typed: a multilingual model's code through its own chooser (language_id), a
    one-pair model's as stated."""
    from toolkit.core.tokenizers import language_id
    from toolkit.serve import languages

    problem = None
    for plan in planned:
        if plan.codes is None:
            if code in {p[0 if side == "source" else 1] for p in plan.pairs}:
                return code
            continue
        try:
            own = language_id(plan.declared, code, side)
        except UsageError as e:
            problem = problem or e
            continue
        back = {model: client for client, model in languages.served_codes(plan.declared).items()}
        return back[own]
    if problem is not None and len(planned) == 1:
        raise problem  # the one model's codes, in its own words
    known = sorted({p[0 if side == "source" else 1] for plan in planned for p in plan.pairs})
    raise UsageError(f"unknown {side} language {code!r}; the served codes: {', '.join(known)}")

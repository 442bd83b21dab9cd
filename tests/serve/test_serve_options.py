"""tk serve's options are declared once (toolkit.serve.options): `tk serve`'s limit options, a RayService's app_builder
arguments and BatchPolicy's and ServeConfig's defaults are all read from that declaration."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from toolkit.core.errors import UsageError  # noqa: E402
from toolkit.serve.app import ServeConfig  # noqa: E402
from toolkit.serve.batcher import BatchPolicy  # noqa: E402
from toolkit.serve.options import LIMITS, LOADING, RAY_ARGUMENTS, fields  # noqa: E402

# tk serve's options that are its own (where it listens, how it runs; the shortlist, on this machine), not a RayService's
SERVE_ONLY = {"host", "port", "no_batching", "api_keys", "on_ray", "ray_address", "body_timeout_s", "header_timeout_s", "shortlist"}


def test_tk_serve_makes_its_limit_options_from_the_declaration_and_takes_every_rayservice_argument():
    from toolkit.cli.commands.serve import serve

    params = {p.name: p for p in serve.params}
    assert set(params) == set(RAY_ARGUMENTS) | SERVE_ONLY
    for o in LIMITS:
        p = params[o.name]
        assert p.opts == ["--" + o.name.replace("_", "-")] and p.default == o.default, o.name
        assert (p.type.min, p.type.max, getattr(p.type, "min_open", False)) == (o.low, o.high, o.low_open), o.name


def test_batch_policy_and_serve_config_default_to_the_declared_values():
    policy, config = BatchPolicy(), ServeConfig()
    for o in LIMITS:
        where, name = o.into.split(".")
        assert getattr(policy if where == "policy" else config, name) == o.value(o.default), o.name
    assert fields({"max_delay_ms": 5.0, "max_chars": 9}, "policy") == {"max_delay_s": 0.005}
    assert fields({"max_delay_ms": 5.0, "max_chars": 9}, "config") == {"max_chars": 9}


def test_a_rayservice_gives_the_declared_arguments_and_each_is_checked_as_tk_serve_checks_it():
    pytest.importorskip("ray")
    from toolkit.serve.ray_app import app_builder

    with pytest.raises(UsageError) as e:
        app_builder({"models": ["m"], "no_such": 1})
    assert set(str(e.value).split("known: ")[1].split(", ")) == set(RAY_ARGUMENTS)
    assert set(LOADING) < set(RAY_ARGUMENTS) and not {"body_timeout_s", "header_timeout_s"} & set(RAY_ARGUMENTS)
    with pytest.raises(UsageError, match=r"^max_chars must be from 1 to 10000, got 0$"):
        app_builder({"models": ["m"], "max_chars": 0})
    with pytest.raises(UsageError, match=r"^timeout_s must be from 0 to 3600 \(not 0\), got '0'$"):
        app_builder({"models": ["m"], "timeout_s": "0"})
    with pytest.raises(UsageError, match="max_delay_ms must be a number"):
        app_builder({"models": ["m"], "max_delay_ms": "soon"})
    assert LIMITS[0].value(10.0) == BatchPolicy().max_delay_s

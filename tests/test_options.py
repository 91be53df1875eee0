"""Trainer switches are typed, frozen dataclasses validated in one place."""
import dataclasses

import pytest

from fsbench.config import ConfigError
from fsbench.training.trainer import option_defaults, resolve_trainer_class, trainer_options
from freescale_impl.trainer import FreeScaleOptions, FreeScaleTrainer


def test_defaults_are_the_strings_set_would_give():
    assert option_defaults(FreeScaleTrainer)["window"] == "1"
    assert FreeScaleOptions.parse({}) == FreeScaleOptions()


def test_parse_types_and_freezes():
    opts = FreeScaleOptions.parse({"window": "4", "partitioner": "lpt"}, prefix="freescale")
    assert opts.window == 4 and opts.partitioner == "lpt"
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.window = 2


@pytest.mark.parametrize("given, message", [
    ({"partitioner": "magic"}, "freescale.partitioner='magic' is not allowed; choose one of: kk, lpt, best"),
    ({"window": "0"}, "freescale.window='0' must be an integer >= 1"),
    ({"max_tokens": "x"}, "freescale.max_tokens='x' must be an integer >= 0"),
    ({"window": "2", "data": "sharded"}, "freescale.window > 1 needs freescale.data=replicated"),
])
def test_bad_switches_are_one_line_errors_naming_the_switch(given, message):
    with pytest.raises(ConfigError) as e:
        trainer_options("freescale", given)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_unknown_switch_lists_the_allowed_ones():
    with pytest.raises(ConfigError, match="allowed: freescale.balance, freescale.partitioner"):
        trainer_options("freescale", {"nope": "1"})


def test_our_trainer_modules_fail_loudly_when_they_cannot_import(monkeypatch, tmp_path):
    """Only a missing third-party extra may read as 'not installed'; an ImportError in the
    project's own code propagates."""
    pkg = tmp_path / "brokenpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("from fsbench.no_such_module import thing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from fsbench.training import trainer as T
    monkeypatch.setitem(T.TRAINERS, "broken", ("brokenpkg.mod:Trainer", "extra", "test"))
    with pytest.raises(ImportError, match="fsbench.no_such_module"):
        resolve_trainer_class("broken")
    (pkg / "mod2.py").write_text("import torchrec_not_installed_pkg\n")
    monkeypatch.setitem(T.TRAINERS, "missing", ("brokenpkg.mod2:Trainer", "torchrec", "test"))
    monkeypatch.setattr(T, "OPTIONAL_PACKAGES", (*T.OPTIONAL_PACKAGES, "torchrec_not_installed_pkg"))
    with pytest.raises(ConfigError, match="needs a package that is missing"):
        resolve_trainer_class("missing")

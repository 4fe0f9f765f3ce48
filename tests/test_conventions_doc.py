"""The conventions every form shares are stated once, where the package states its conventions, and pointed to:
non-finite ``q, k, v`` stay confined to the outputs that depend on them (the contract test checks it for every
form); the other arguments must be finite and are refused otherwise."""
import pathedu
from pathedu import checks, path, pathfox


def test_non_finite_inputs_are_stated_once_in_pathedu_checks():
    doc = " ".join(checks.__doc__.split())
    assert "Non-finite inputs" in doc
    assert "a NaN or inf in any of them at position ``t`` changes only the outputs" in doc
    assert "never an earlier one" in doc and "refused with a ``ValueError`` naming the argument" in doc


def test_the_package_and_the_path_modules_point_to_it():
    assert ":mod:`pathedu.checks` says how" in " ".join(pathedu.__doc__.split())
    for module in (path, pathfox):
        assert '(:mod:`pathedu.checks`, "Non-finite inputs")' in " ".join(module.__doc__.split()), module.__name__

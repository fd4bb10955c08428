"""A SIGTERM whose exception a finalizer swallowed still stops the controller (in-process, no Ray).

CI once saw SQLAlchemy free an object while the signal arrived: the handler's `Terminated` was
raised inside a weakref callback, Python printed "Exception ignored" and the study ran to its end
with exit 0. The signal is recorded as well as raised; these tests reproduce the swallow on purpose.
"""

from __future__ import annotations

import gc
import signal

import pytest

from autotune._signals import Terminated, raise_if_terminated, sigterm_as_interrupt


class _SignalsInFinalizer:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)  # the handler runs here; its exception is swallowed


def _swallowed_sigterm() -> None:
    _SignalsInFinalizer()  # freed at once: __del__ runs, "Exception ignored" goes to unraisablehook
    gc.collect()


def test_a_swallowed_sigterm_is_raised_again_at_the_next_check(monkeypatch):
    swallowed = []
    monkeypatch.setattr("sys.unraisablehook", lambda info: swallowed.append(info.exc_type))
    with pytest.raises(Terminated):
        with sigterm_as_interrupt():
            _swallowed_sigterm()
            assert swallowed == [Terminated]  # the situation of the CI failure
            raise_if_terminated()
            pytest.fail("raise_if_terminated did not raise")


def test_a_body_that_ends_normally_after_a_swallowed_sigterm_still_raises(monkeypatch):
    monkeypatch.setattr("sys.unraisablehook", lambda info: None)
    with pytest.raises(Terminated):
        with sigterm_as_interrupt():
            _swallowed_sigterm()


def test_the_record_does_not_outlive_the_block(monkeypatch):
    monkeypatch.setattr("sys.unraisablehook", lambda info: None)
    with pytest.raises(Terminated):
        with sigterm_as_interrupt():
            _swallowed_sigterm()
    raise_if_terminated()  # a later loop outside the block is not stopped by an old signal
    assert signal.getsignal(signal.SIGTERM) is not None
    with sigterm_as_interrupt():
        raise_if_terminated()  # nor a later block


class _InterruptsInFinalizer:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)


def test_a_swallowed_ctrl_c_is_raised_again_as_a_plain_interrupt(monkeypatch):
    monkeypatch.setattr("sys.unraisablehook", lambda info: None)
    with pytest.raises(KeyboardInterrupt) as raised:
        with sigterm_as_interrupt():
            _InterruptsInFinalizer()
            gc.collect()
            raise_if_terminated()
    assert raised.type is KeyboardInterrupt  # not Terminated: the CLI exits 130, not 143
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

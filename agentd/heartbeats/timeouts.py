"""How long a worker may go without progress: set by flags, or learned from what it did.

Every interval the agent sees between two progress messages of a worker is a sample of
the key it passed in: :data:`STEP` outside sections, else the innermost section. Once a key has
:data:`MIN_SAMPLES`, its timeout is the :data:`QUANTILE` of the last :data:`WINDOW`
samples times the safety factor, never below the floor. Until then, and until a worker's
first message, the initial timeout applies. Flags override what is learned.

A rank resumed in process (:data:`START`) is held to less than the initial timeout before
its first heartbeat: it only waits for the new workers of the attempt to start, and the
agent saw how long new workers take to their first message (every such time is a sample
of :data:`START`). From one sample on, the timeout is the :data:`QUANTILE` of those
times, plus the ``allowance`` (how long this node's zygote took to preload: a node that
joined just now may still be preloading), times the safety factor; never below
:data:`RESUME_FLOOR`, never above the initial timeout (``--resume-heartbeat-timeout``
overrides it).

The samples live in ``<run dir>/heartbeats.json``, so an agent restarted for the same run
starts with what the last one learned.
"""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentd.heartbeats.settings import START, STEP, HeartbeatSettings

log = logging.getLogger(__name__)

MIN_SAMPLES = 8
WINDOW = 256
QUANTILE = 0.99
SAVE_INTERVAL = 5.0
"""Seconds between two writes of the learned samples while they change."""
MAX_KEYS = 64
"""Sections remembered (the step included); more are held to the initial timeout."""
RESUME_FLOOR = 30.0
"""The least a rank resumed in process may take to its first heartbeat, in seconds."""
_RELOG_RATIO = 1.25


def key_name(key: str) -> str:
    """How a key reads in logs and reports."""
    if key == START:
        return "resume"
    return "step" if key == STEP else f"section {key!r}"


@dataclass(frozen=True)
class Timeout:
    """A key's timeout now: ``source`` is explicit, learned or initial."""

    seconds: float
    source: str
    samples: int = 0
    observed: float = 0.0
    """The learned quantile the timeout was made from (learned only)."""
    allowance: float = 0.0
    """Seconds added to the quantile before the safety factor (:data:`START` only)."""
    sampled: str = "intervals"
    """What the samples are: intervals between messages, or new workers' ``starts``."""

    def describe(self) -> str:
        if self.source == "learned":
            added = f" + {self.allowance:.2f}s preload" if self.allowance else ""
            return (
                f"{self.seconds:.2f}s learned (p{QUANTILE * 100:g} of {self.samples} "
                f"{self.sampled} {self.observed:.3f}s{added})"
            )
        return f"{self.seconds:.2f}s {self.source}"


def _quantile(samples: collections.abc.Collection[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(QUANTILE * len(ordered)) - 1)]


class LearnedTimeouts:
    """The samples of every key, the timeouts made from them, and their file."""

    def __init__(self, settings: HeartbeatSettings, path: Path | None = None) -> None:
        self.settings = settings
        self.path = path
        self.instrumented = False
        """Some worker of this run heartbeated (in this agent or, per the file, a former)."""
        self._samples: dict[str, collections.deque[float]] = {}
        self._cache: dict[str, Timeout] = {}
        self._logged: dict[str, float] = {}
        self._dirty = False
        self._saved_at = -math.inf
        self._allowance = 0.0

    @property
    def allowance(self) -> float:
        """Seconds a new worker may start later than those seen (see :data:`START`)."""
        return self._allowance

    @allowance.setter
    def allowance(self, seconds: float) -> None:
        if seconds != self._allowance:
            self._allowance = max(0.0, seconds)
            self._cache.pop(START, None)

    def load(self) -> None:
        """Take the samples a former agent of this run saved; a bad file is only logged."""
        if self.path is None or not self.path.exists():
            return
        try:
            doc = json.loads(self.path.read_text())
            samples = doc["samples"]
            loaded = {str(k): [float(x) for x in v if float(x) >= 0] for k, v in samples.items()}
            instrumented = bool(doc.get("instrumented", True))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("Ignoring %s: not a heartbeat record (%s)", self.path, exc)
            return
        for key, values in list(loaded.items())[:MAX_KEYS]:
            self._samples[key] = collections.deque(values[-WINDOW:], maxlen=WINDOW)
        self.instrumented = instrumented
        learned = [
            f"{key_name(k)} {t.seconds:.2f}s"
            for k in self._samples
            if (t := self.timeout(k)).source == "learned"
        ]
        if learned:
            log.info(
                "Heartbeat timeouts learned by an earlier agent of this run (%s): %s",
                self.path,
                ", ".join(learned),
            )
            self._logged.update({k: self.timeout(k).seconds for k in self._samples})

    def observe(self, key: str, interval: float) -> None:
        """One interval of ``key`` seen."""
        samples = self._samples.get(key)
        if samples is None:
            if len(self._samples) >= MAX_KEYS:
                return
            samples = self._samples[key] = collections.deque(maxlen=WINDOW)
        samples.append(max(0.0, interval))
        self._cache.pop(key, None)
        self._dirty = True
        timeout = self.timeout(key)
        if timeout.source != "learned":
            return
        before = self._logged.get(key)
        if before is None or not 1 / _RELOG_RATIO < timeout.seconds / before < _RELOG_RATIO:
            self._logged[key] = timeout.seconds
            floor = RESUME_FLOOR if key == START else self.settings.min_timeout
            log.info(
                "Heartbeat timeout for %s: %s x %g (floor %gs)",
                "a rank resumed in process, until its first heartbeat"
                if key == START
                else f"the {key_name(key)}",
                timeout.describe(),
                self.settings.safety_factor,
                floor,
            )

    def timeout(self, key: str) -> Timeout:
        """``key``'s timeout: the flag's, else the learned one, else the initial one."""
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        explicit = self.settings.explicit(key)
        samples = self._samples.get(key, ())
        if explicit is not None:
            timeout = Timeout(explicit, "explicit", len(samples))
        elif key == START:
            timeout = self._resume_timeout(samples)
        elif len(samples) >= MIN_SAMPLES:
            observed = _quantile(samples)
            seconds = max(self.settings.min_timeout, observed * self.settings.safety_factor)
            timeout = Timeout(seconds, "learned", len(samples), observed)
        else:
            timeout = Timeout(self.settings.initial, "initial", len(samples))
        self._cache[key] = timeout
        return timeout

    def _resume_timeout(self, starts: collections.abc.Collection[float]) -> Timeout:
        """The :data:`START` rule (see the module's docstring)."""
        settings = self.settings
        if not starts:
            return Timeout(settings.initial, "initial")
        observed = _quantile(starts)
        seconds = max(RESUME_FLOOR, (observed + self._allowance) * settings.safety_factor)
        seconds = min(settings.initial, seconds)
        return Timeout(seconds, "learned", len(starts), observed, self._allowance, "starts")

    def mark_instrumented(self) -> None:
        """A worker of this run heartbeated: from now on (restarts included) every worker
        is held to the initial timeout until its first heartbeat."""
        if not self.instrumented:
            self.instrumented = self._dirty = True

    def save_if_due(self, now: float) -> None:
        """Write the samples if they changed and the last write is :data:`SAVE_INTERVAL` old."""
        if self._dirty and now - self._saved_at >= SAVE_INTERVAL:
            self._saved_at = now
            self.save()

    def save(self) -> None:
        """Write the samples now (atomically: a crash leaves the old file or the new)."""
        self._dirty = False
        if self.path is None:
            return
        samples = {k: [round(x, 6) for x in v] for k, v in self._samples.items()}
        doc = {"version": 1, "instrumented": self.instrumented, "samples": samples}
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            temporary.write_text(json.dumps(doc))
            os.replace(temporary, self.path)
        except OSError as exc:
            log.warning("Could not save the heartbeat timeouts to %s: %s", self.path, exc.strerror)
            with contextlib.suppress(OSError):
                temporary.unlink()

    def status(self) -> dict[str, Any]:
        """Each key's timeout, for ``/status``."""
        keys = dict.fromkeys([STEP, *self._samples, *self.settings.section_timeouts])
        out = {}
        for key in keys:
            timeout = self.timeout(key)
            out[key_name(key)] = {
                "seconds": round(timeout.seconds, 3),
                "source": timeout.source,
                "samples": timeout.samples,
            }
        return out

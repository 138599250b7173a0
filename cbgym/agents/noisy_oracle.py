"""An oracle with imperfect knowledge: the true output lengths, partly shuffled between requests.

The multiset of job lengths is kept exactly; only which request gets which length is wrong for
a fraction of the requests. This separates "how good is the predictor" from "how heavy-tailed
is the workload" (the scheduler article's accuracy slider).
"""

from __future__ import annotations

import numpy as np

from cbgym.agents.oracles import OracleSJF, OracleWork
from cbgym.agents.params import parse_float
from cbgym.engine.decision import PolicyContext


def believed_outputs(true_output: np.ndarray, accuracy: float, seed: int) -> np.ndarray:
    """``true_output`` with ``round((1 - accuracy) n)`` entries permuted among themselves.

    The chosen requests (seeded) swap lengths in a random permutation, so accuracy 1 is the
    truth and accuracy 0 a random permutation of every length (a few may stay in place).
    """
    n = len(true_output)
    rng = np.random.default_rng(seed)
    chosen = rng.choice(n, size=int(round((1.0 - accuracy) * n)), replace=False)
    believed = np.array(true_output, copy=True)
    believed[chosen] = true_output[rng.permutation(chosen)]
    believed.flags.writeable = False
    return believed


class _Noisy:
    """Mixin: after the oracle's reset, replace the privileged lengths by believed ones."""

    name: str

    def __init__(self, accuracy: str | float | None = None) -> None:
        if accuracy is None:
            raise ValueError(f"policy {self.name!r} needs an accuracy ACC in [0, 1] "
                             "(1 = the oracle), e.g. 'noisy-oracle:0.8'")
        self.accuracy = parse_float(accuracy, self.name, "accuracy", 0.0, 1.0)
        self.label = f"{self.name}:{self.accuracy:g}"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)  # type: ignore[misc]
        assert ctx.true_output_tokens is not None  # the oracle's reset checked it
        self._true_output = believed_outputs(ctx.true_output_tokens, self.accuracy, ctx.seed)


class NoisyOracle(_Noisy, OracleSJF):
    """Oracle-SJF on believed output lengths: shortest believed output first.

    A fraction ``1 - accuracy`` of the requests (chosen with ``ctx.seed``) have their true
    lengths permuted among themselves; 1.0 is Oracle-SJF, 0.0 ranks by a random permutation
    of all lengths. Uses ``true_output_tokens`` (which carries the believed lengths, see
    ``privileged_output_tokens``); privileged.

    Args:
        accuracy: fraction of requests whose length is known correctly, in [0, 1].
    """

    name = "noisy-oracle"


class NoisyOracleWork(_Noisy, OracleWork):
    """Oracle-Work on believed output lengths (same corruption as :class:`NoisyOracle`).

    Key: ``c_f + c_p x + c_d y_believed`` seconds; 1.0 is Oracle-Work. Privileged.

    Args:
        accuracy: fraction of requests whose length is known correctly, in [0, 1].
    """

    name = "noisy-oracle-work"

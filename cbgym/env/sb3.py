"""Use any Gymnasium 1.x ``VectorEnv`` as a stable-baselines3 ``VecEnv``.

SB3 algorithms only accept their own ``VecEnv`` API (``reset()`` returns observations only,
``step`` returns ``(obs, rewards, dones, infos)`` with a list of per-env info dicts and
``infos[i]["terminal_observation"]`` when env ``i`` ended). :class:`SB3VecEnv` converts a
Gymnasium vector env that autoresets in the same step (``AutoresetMode.SAME_STEP``) into that
API, so a batched (native or ``"sync"``) vector env can feed ``PPO`` or ``MaskablePPO``
directly; ``env_method("action_masks")`` returns the rows of the batched masks.

Example:
    >>> from stable_baselines3 import PPO
    >>> from stable_baselines3.common.vec_env import VecMonitor
    >>> from cbgym.env.sb3 import make_sb3_vec_env
    >>> venv = VecMonitor(make_sb3_vec_env("cbgym/Scheduling-v0", 4, seed=0,
    ...                                    episode_requests=64))
    >>> model = PPO("MultiInputPolicy", venv, n_steps=128, device="cpu").learn(1024)

Wrap with SB3's ``VecMonitor`` to get episode returns in SB3's logs. Gymnasium's vector
``RecordEpisodeStatistics`` on the vector env passes through too, but before gymnasium 1.4 it
assumes next-step autoreset: every episode after an env's first is counted one step (and that
step's reward) short.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvObs, VecEnvStepReturn

__all__ = ["SB3VecEnv", "make_sb3_vec_env"]

_MISSING = object()


def _unbatch_info(info: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """Env ``i``'s entries of a Gymnasium dict-of-arrays info (``_key`` masks respected)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key in ("final_obs", "final_info") or (key.startswith("_") and key[1:] in info):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        if isinstance(value, dict):
            out[key] = _unbatch_info(value, i, n)
        elif mask is not None or (isinstance(value, np.ndarray) and value.shape[:1] == (n,)):
            out[key] = value[i]
        else:
            out[key] = value
    return out


def _pick_obs(obs: Any, i: int) -> Any:
    """A copy of env ``i``'s observation from a batched (or object-array) observation."""
    if isinstance(obs, dict):
        return {k: _pick_obs(v, i) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_pick_obs(v, i) for v in obs)
    row = obs[i]
    if isinstance(obs, np.ndarray) and obs.dtype == object:  # one single-env obs per entry
        return copy.deepcopy(row)
    return np.array(row, copy=True)


def _copy_obs(obs: Any) -> VecEnvObs:
    """Fresh arrays: SB3 keeps ``_last_obs`` across the next step (buffers may be reused)."""
    if isinstance(obs, dict):
        return {k: np.array(v, copy=True) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(np.array(v, copy=True) for v in obs)
    return np.array(obs, copy=True)


class SB3VecEnv(VecEnv):
    """Adapt a Gymnasium ``VectorEnv`` with ``autoreset_mode=SAME_STEP`` to SB3's ``VecEnv``.

    Attribute and method access (``get_attr``, ``set_attr``, ``env_method``) looks at the
    vector env first, then at its sub-envs (``envs`` of a sync vector env, or ``call``/
    ``get_attr``/``set_attr`` of an async one).
    """

    def __init__(self, venv: VectorEnv) -> None:
        mode = venv.metadata.get("autoreset_mode")
        if mode != AutoresetMode.SAME_STEP:
            raise ValueError(
                f"SB3VecEnv needs a vector env with autoreset_mode=AutoresetMode.SAME_STEP, got "
                f"{mode!r}; build one with gym.make_vec(id, num_envs=N, vectorization_mode="
                f"'sync', vector_kwargs={{'autoreset_mode': AutoresetMode.SAME_STEP}}) (a native "
                f"vector entry point takes autoreset_mode= as a keyword) or make_sb3_vec_env()")
        self.venv = venv
        self._actions: np.ndarray | None = None
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)

    # ------------------------------------------------------------------ stepping
    def reset(self) -> VecEnvObs:
        seeds, first = list(self._seeds), self._seeds[0]
        seed: int | list[int | None] | None = seeds
        if all(s is None for s in seeds):
            seed = None
        elif first is not None and seeds == [first + j for j in range(self.num_envs)]:
            seed = first  # the vector env's own convention: env i gets seed + i
        if any(o != self._options[0] for o in self._options):
            raise ValueError("a Gymnasium vector env resets with one options dict for all envs")
        options = self._options[0] or None
        obs, info = self.venv.reset(seed=seed, options=options)
        self.reset_infos = [_unbatch_info(info, i, self.num_envs) for i in range(self.num_envs)]
        self._reset_seeds()
        self._reset_options()
        return _copy_obs(obs)

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        if self._actions is None:
            raise RuntimeError("step_wait() called without step_async()")
        obs, rewards, terminated, truncated, info = self.venv.step(self._actions)
        self._actions = None
        n = self.num_envs
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        dones = terminated | truncated
        infos = [_unbatch_info(info, i, n) for i in range(n)]
        final_obs, final_info = info.get("final_obs"), info.get("final_info", {})
        ended = info.get("_final_obs", dones)
        for i in np.flatnonzero(dones):
            self.reset_infos[i] = infos[i]  # SAME_STEP: the top-level info is the reset's
            infos[i] = {**infos[i], **_unbatch_info(final_info, int(i), n)}
            if final_obs is not None and ended[i]:
                infos[i]["terminal_observation"] = _pick_obs(final_obs, int(i))
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
        return _copy_obs(obs), np.asarray(rewards, np.float32).copy(), dones, infos

    def close(self) -> None:
        self.venv.close()

    # ------------------------------------------------------------------ rendering
    def get_images(self) -> Sequence[np.ndarray | None]:
        frames = self.venv.render() if self.render_mode == "rgb_array" else None
        return list(frames) if frames is not None else [None] * self.num_envs

    def render(self, mode: str | None = None) -> Any:
        """The vector env's ``render()``; for ``"rgb_array"``, the first frame of a sequence."""
        if self.render_mode is None or (mode is not None and mode != self.render_mode):
            return None
        frames = self.venv.render()
        if self.render_mode == "rgb_array" and isinstance(frames, (tuple, list)):
            return frames[0] if frames else None
        return frames

    # ------------------------------------------------------------------ attributes and methods
    def _sub_envs(self) -> list[gym.Env] | None:
        envs = getattr(self.venv, "envs", None)
        return list(envs) if envs is not None else None

    def _rows(self, value: Any, indices: list[int]) -> list[Any]:
        """Per-env entries of a batched result, else the single value for every index."""
        if isinstance(value, (np.ndarray, tuple, list)) and len(value) == self.num_envs:
            return [value[i] for i in indices]
        return [value for _ in indices]

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        idx = list(self._get_indices(indices))
        value = getattr(self.venv, attr_name, _MISSING)
        if value is not _MISSING:
            return [value for _ in idx]
        envs = self._sub_envs()
        if envs is not None:
            return [envs[i].get_wrapper_attr(attr_name) for i in idx]
        if hasattr(self.venv, "call"):  # async vector env: the attribute of every sub-env
            return [self.venv.get_attr(attr_name)[i] for i in idx]  # type: ignore[attr-defined]
        raise AttributeError(f"neither the vector env nor its sub-envs have {attr_name!r}")

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        idx = list(self._get_indices(indices))
        envs = self._sub_envs()
        if hasattr(self.venv, attr_name) and (envs is None or len(idx) == self.num_envs):
            setattr(self.venv, attr_name, value)
        elif envs is not None:
            for i in idx:
                envs[i].set_wrapper_attr(attr_name, value)
        elif hasattr(self.venv, "set_attr") and len(idx) == self.num_envs:
            self.venv.set_attr(attr_name, value)  # type: ignore[attr-defined]
        else:
            raise AttributeError(f"cannot set {attr_name!r} on envs {idx} of this vector env")

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        """Call a method of the vector env (batched result split per env) or of the sub-envs.

        ``env_method("action_masks")`` gives the N rows of the vector env's ``action_masks()``
        (what sb3-contrib's ``MaskablePPO`` stacks).
        """
        idx = list(self._get_indices(indices))
        method = getattr(self.venv, method_name, None)
        if callable(method):
            return self._rows(method(*method_args, **method_kwargs), idx)
        envs = self._sub_envs()
        if envs is not None:
            return [envs[i].get_wrapper_attr(method_name)(*method_args, **method_kwargs)
                    for i in idx]
        if hasattr(self.venv, "call"):
            results = self.venv.call(method_name, *method_args, **method_kwargs)  # type: ignore
            return [results[i] for i in idx]
        raise AttributeError(f"neither the vector env nor its sub-envs have {method_name!r}")

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper],
                       indices: VecEnvIndices = None) -> list[bool]:
        from stable_baselines3.common.env_util import is_wrapped

        idx = list(self._get_indices(indices))
        envs = self._sub_envs()
        if envs is None:
            return [False for _ in idx]
        return [is_wrapped(envs[i], wrapper_class) for i in idx]


def make_sb3_vec_env(env_id: str, num_envs: int, seed: int | None = None,
                     **env_kwargs: Any) -> SB3VecEnv:
    """``gym.make_vec(env_id, ...)`` with same-step autoreset, wrapped in :class:`SB3VecEnv`.

    Uses the id's vector entry point (given ``autoreset_mode=`` as a keyword) when it has one,
    else a ``"sync"`` vector env of single envs; also that when a ``render_mode`` is asked for
    (cbgym's native vector envs do not render: video comes from single envs).
    ``seed`` seeds the first reset (env i gets ``seed + i``).
    """
    native = gym.spec(env_id).vector_entry_point is not None
    if native and env_kwargs.get("render_mode") is None:
        venv = gym.make_vec(env_id, num_envs=num_envs, autoreset_mode=AutoresetMode.SAME_STEP,
                            **env_kwargs)
    else:
        venv = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                            **env_kwargs)
    env = SB3VecEnv(venv)
    if seed is not None:
        env.seed(seed)
    return env

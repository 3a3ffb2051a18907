"""``TrajectoryBuilder``: turns one stage's chunk steps into a :class:`Trajectory`.

It implements the T+1 convention and the two reward/flag fixes of this
implementation (see ``docs/embodied.md``):

* Episode-end flags are placed at the sub-step that actually ended the episode
  (the env reports them in the chunk's last column): with ``C > 1`` the dead
  sub-steps after an in-chunk end get no flag, are masked out of the loss by
  ``alive`` and carry zero reward, so neither GAE nor GRPO sees them.
* The bootstrap ``gamma * V(final obs)`` of a truncated episode (any ended
  episode with ``bootstrap_type: always``) is added to the reward of that
  sub-step once the rollout has evaluated the final observation, i.e. when the
  next policy output of the stage arrives.

With ``collect_next_obs`` (SAC), each chunk's ``forward_inputs`` also get
``next_<key>`` entries: the observation after the chunk, i.e. the episode's
real final observation where it ended (``final_obs``), not the reset one, so
an off-policy critic can bootstrap from it on truncation.
"""

from __future__ import annotations

import torch

from rlinf.core.protocols.embodied import EnvOutput, PolicyOutput, Trajectory

__all__ = ["TrajectoryBuilder"]


def _float32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as float32; itself when it already is (one dispatch less per step)."""
    return tensor if tensor.dtype == torch.float32 else tensor.to(torch.float32)


class TrajectoryBuilder:
    """Collects one rollout epoch of one env stage.

    Call order per chunk step: :meth:`add_policy_output` (the policy output
    acting on the current obs; it also settles the previous chunk's bootstrap),
    then :meth:`add_chunk` (the env's output after the chunk). After the last
    chunk, :meth:`finish` with the policy output on the last observation.

    Args:
        num_envs: ``n``.
        num_chunks: ``C``.
        gamma: Discount used for the bootstrap.
        bootstrap_type: ``standard`` (truncations) or ``always`` (every end).
        collect_next_obs: Store ``next_<key>`` forward inputs (see the module docstring).
    """

    def __init__(
        self,
        num_envs: int,
        num_chunks: int,
        gamma: float,
        bootstrap_type: str,
        collect_next_obs: bool = False,
    ) -> None:
        self.n, self.c = num_envs, num_chunks
        self.collect_next_obs = collect_next_obs
        self.gamma = gamma
        self.bootstrap_always = bootstrap_type == "always"
        self.actions: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.forward_inputs: list[dict[str, torch.Tensor]] = []
        self.versions: list[int] = []
        self.rewards: list[torch.Tensor] = []
        self.terminations: list[torch.Tensor] = []
        self.truncations: list[torch.Tensor] = []
        self.alive: list[torch.Tensor] = []
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self._no_flags = torch.zeros(num_envs, num_chunks, dtype=torch.bool)

    def _settle(self, output: PolicyOutput) -> None:
        """Adds ``gamma * V(final obs)`` to the last reward of episodes that ended last chunk."""
        if self._pending is None:
            return
        mask, col = self._pending
        self._pending = None
        if not bool(mask.any()):
            return
        if output.bootstrap_values is not None:
            value = output.bootstrap_values[:, 0]
        elif output.prev_values is not None:
            value = output.prev_values[:, 0]  # held final obs (no auto-reset)
        else:
            return
        self._add_bootstrap(len(self.rewards) - 1, mask, col, value)

    def _add_bootstrap(
        self, row: int, mask: torch.Tensor, col: torch.Tensor, value: torch.Tensor
    ) -> None:
        rows = torch.nonzero(mask).squeeze(1)
        rewards = self.rewards[row]
        rewards[rows, col[rows]] += self.gamma * value[rows].to(rewards.dtype)

    def add_policy_output(self, output: PolicyOutput) -> None:
        """Records the action chunk chosen on the current observation.

        Args:
            output: The rollout's output for this stage (CPU tensors).
        """
        self._settle(output)
        if output.prev_logprobs is None:
            raise ValueError("a train policy output needs prev_logprobs")
        self.actions.append(_float32(output.actions.reshape(self.n, -1)))
        self.logprobs.append(_float32(output.prev_logprobs))
        self.values.append(self._values_row(output))
        self.forward_inputs.append(dict(output.forward_inputs))
        self.versions.append(int(output.version))

    def add_chunk(self, out: EnvOutput, alive: torch.Tensor) -> None:
        """Records the env's output after a chunk step.

        Args:
            out: The env output (rewards and flags [n, C], flags in the last column).
            alive: [n, C] bool: sub-steps that advanced a live episode.
        """
        if out.rewards is None:
            raise ValueError("a chunk step's env output must carry rewards")
        if alive.dtype != torch.bool:  # (each skipped no-op .to() saves a dispatch per step)
            alive = alive.to(torch.bool)
        self.rewards.append(torch.where(alive, _float32(out.rewards), 0.0))
        self.alive.append(alive)
        if self.collect_next_obs:
            after = out.final_obs if out.final_obs is not None else out.obs
            inputs = self.forward_inputs[-1]
            for key in [k for k in inputs if k in after]:
                inputs[f"next_{key}"] = after[key].to(inputs[key].dtype).clone()
        # Most chunk steps end no episode (flags are only ever set in the last column).
        if not (out.terminations.any() or out.truncations.any()):
            self.terminations.append(self._no_flags)  # (read-only: shared by such steps)
            self.truncations.append(self._no_flags)
            self._pending = None
            return
        last_term, last_trunc = out.terminations[:, -1], out.truncations[:, -1]
        started_live = alive[:, 0]
        term = last_term & started_live
        trunc = last_trunc & started_live & ~term
        col = (alive.sum(dim=1) - 1).clamp(min=0)
        rows = torch.arange(self.n)
        terminations = torch.zeros(self.n, self.c, dtype=torch.bool)
        truncations = torch.zeros(self.n, self.c, dtype=torch.bool)
        terminations[rows[term], col[term]] = True
        truncations[rows[trunc], col[trunc]] = True
        self.terminations.append(terminations)
        self.truncations.append(truncations)
        bootstrap = trunc | term if self.bootstrap_always else trunc
        self._pending = (bootstrap, col)

    @staticmethod
    def _values_row(output: PolicyOutput) -> torch.Tensor:
        if output.prev_values is None:
            raise ValueError("a train policy output needs prev_values")
        return output.prev_values.to(torch.float32)

    def finish(
        self, final: PolicyOutput, group_ids: torch.Tensor, num_steps: int | None = None
    ) -> Trajectory:
        """Builds the trajectory, given the policy output on the last observation.

        Args:
            final: Policy output on the observation after the last chunk (its
                ``prev_values`` become the last value row; its bootstrap values
                settle the last chunk).
            group_ids: [n] group of each env.
            num_steps: Pad to this many chunk steps (a stream that stopped early
                because all its episodes ended): padded steps are not alive, have
                zero rewards, no flags, zero values and copies of the last inputs.

        Returns:
            The trajectory ([T, n, ...] and [T + 1, n, ...] tensors).
        """
        self._settle(final)
        t = len(self.rewards)
        if t == 0 or len(self.actions) != t:
            raise ValueError(f"inconsistent trajectory: {len(self.actions)} actions, {t} chunks")
        values = list(self.values)
        final_values = self._values_row(final)
        if num_steps is not None and num_steps > t:
            zeroed = (self.actions, self.logprobs, self.rewards)
            zeroed_flags = (self.terminations, self.truncations, self.alive)
            for _ in range(num_steps - t):
                for rows in (*zeroed, *zeroed_flags):
                    rows.append(torch.zeros_like(rows[-1]))
                values.append(final_values)
                self.forward_inputs.append(self.forward_inputs[-1])
                self.versions.append(self.versions[-1])
        first = torch.zeros(1, self.n, self.c, dtype=torch.bool)
        terminations = torch.cat([first, torch.stack(self.terminations)])
        truncations = torch.cat([first, torch.stack(self.truncations)])
        keys = list(self.forward_inputs[0])
        return Trajectory(
            actions=torch.stack(self.actions),
            prev_logprobs=torch.stack(self.logprobs),
            prev_values=torch.stack([*values, final_values]),
            rewards=torch.stack(self.rewards),
            dones=terminations | truncations,
            terminations=terminations,
            truncations=truncations,
            forward_inputs={k: torch.stack([f[k] for f in self.forward_inputs]) for k in keys},
            versions=torch.tensor(self.versions, dtype=torch.int64),
            group_ids=group_ids.clone(),
            alive=torch.stack(self.alive),
        )

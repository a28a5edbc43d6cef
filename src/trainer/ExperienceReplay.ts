/**
 * Experience replay of rare successes (ExGRPO-style, arXiv:2510.02245; self-imitation learning, Oh et al. 2018):
 * the trainer keeps, per prompt, the latest successful trajectory of a group that was only partly solved, and when
 * the same prompt comes back and none of the new group's samples succeeds, adds the kept success to the group before
 * advantages are computed. The group then carries signal again (the success against the new failures) instead of
 * being dropped as zero-variance, so a skill learned from a rare success is not silently forgotten.
 *
 * Where it acts: on prompts that come back (`trainer.epochs` > 1, or datasets that repeat a prompt under several
 * uids), are solved at one visit and failed by every sample at a later one. In the quickstart (18 record prompts that
 * repeat) a run loses a few such prompts, sometimes for many visits ("Order ids of Eve Green?": 9 visits solved, then
 * 0 of 8 at 13 in a row); one run with replay on fired twice in 176 steps (bench/results/quickstart-history.md).
 *
 * Rules, in order, for each group of a step (pure; `apply`):
 * 1. Key: the rendered prompt (`promptIds`), so rows that repeat a prompt under another uid share an entry.
 * 2. No sample of the group reaches `successThreshold` and the buffer holds a success for the key: that trajectory
 *    joins the group as one more sample (`replay: true`; its `sample` index is the group size).
 * 3. Then the buffer learns from the group as generated: every sample succeeded → the entry is dropped (the prompt is
 *    solved); some succeeded → the entry becomes the group's last success (the freshest behaviour); none → unchanged.
 * 4. At most `maxPrompts` entries: the least recently stored goes first.
 *
 * The trainer treats a replayed trajectory as if sampled now (π_rollout := π_old for its tokens, so the off-policy
 * correction leaves it at weight 1): it is an imitation target, and its old sampler's log-probs would otherwise
 * down-weight exactly the tokens the policy has forgotten.
 */
import type { Trajectory, TrajectoryGroup } from "../domain/Trajectory.ts"

export interface Config {
  readonly successThreshold: number // a sample with reward ≥ this is a success
  readonly maxPrompts: number // buffer capacity, in distinct prompts
}

/** One kept success. Plain data: it is written into checkpoints (`trainer_state.json`). */
export interface Entry {
  readonly key: string
  readonly trajectory: Trajectory
}

/** Insertion-ordered (oldest first), so eviction takes the first key. */
export type Buffer = Map<string, Trajectory>

export const keyOf = (t: Trajectory): string => t.promptIds.join(",")

export interface Applied {
  readonly groups: ReadonlyArray<TrajectoryGroup> // the step's groups, replays added
  readonly injected: number // groups that received a replayed success
}

/** Rules 2–4 over one step's groups; mutates `buffer`. Replays never come from the step's own groups. */
export const apply = (buffer: Buffer, groups: ReadonlyArray<TrajectoryGroup>, config: Config): Applied => {
  const success = (t: Trajectory) => t.reward >= config.successThreshold
  let injected = 0
  const out = groups.map((g) => {
    const first = g.trajectories[0]
    if (first === undefined || g.trajectories.some(success)) return g
    const kept = buffer.get(keyOf(first))
    if (kept === undefined) return g
    injected++
    const replayed: Trajectory = {
      ...kept,
      id: `${kept.id}@replay`,
      promptUid: g.promptUid,
      sample: g.trajectories.length,
      replay: true
    }
    return { ...g, trajectories: [...g.trajectories, replayed] }
  })
  for (const g of groups) {
    const first = g.trajectories[0]
    if (first === undefined) continue
    const key = keyOf(first)
    const successes = g.trajectories.filter(success)
    if (successes.length === 0) continue
    buffer.delete(key)
    if (successes.length < g.trajectories.length) buffer.set(key, successes[successes.length - 1]!)
  }
  while (buffer.size > config.maxPrompts) buffer.delete(buffer.keys().next().value!)
  return { groups: out, injected }
}

export const entries = (buffer: Buffer): Array<Entry> => [...buffer].map(([key, trajectory]) => ({ key, trajectory }))

export const fromEntries = (list: ReadonlyArray<Entry>): Buffer => new Map(list.map((e) => [e.key, e.trajectory]))

"""Temporal task-queue names, in one place (docs/design.md section 9)."""

EPISODES = "episodes"  # EpisodeWorkflow and TrainingRunWorkflow
INFERENCE = "inference"  # generate, publish_weights (hosts a vLLM engine)
TRAINER = "trainer"  # the learner step (GPU at scale)
IO = "io"  # materialization, reward, staging cleanup
HARNESS = "harness"  # external harness processes and the native harness

ALL = (EPISODES, INFERENCE, TRAINER, IO, HARNESS)

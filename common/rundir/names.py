"""The names of what a run directory holds: written once here, read everywhere through these constants."""

#: the resolved settings and everything about where and how the run ran (rank 0 writes it at the start)
CONFIG_FILE = "config.json"
#: one JSON event a line: start, step, epoch, eval, note, summary
METRICS_FILE = "metrics.jsonl"
#: the run's final numbers and the checksum of its final weights
SUMMARY_FILE = "summary.json"
#: the final model's state_dict, loadable with torch.load(..., weights_only=True)
MODEL_FILE = "model.pt"
#: TensorBoard's event files, from the same events as METRICS_FILE
TENSORBOARD_DIR = "tensorboard"
#: how the comparison launched the run (its launcher, command and log), and that launch's output
LAUNCH_RECORD = "launch.json"
LAUNCH_LOG = "launch.log"
#: the working directory a comparison gives a run of a user's script: links to the folder it was started in, and
#: whatever the script writes there
WORKING_DIR = "cwd"

RUN_FILES = (CONFIG_FILE, SUMMARY_FILE, METRICS_FILE, MODEL_FILE)

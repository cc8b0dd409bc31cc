"""python -m ddp_train.port: a Horovod training script rewritten as a plain DDP script, with a report.

    python -m ddp_train.port train_horovod.py [-o train_ddp.py] [--diff] [--report-json R] [--zero-step keep]
    python -m ddp_train.port PROJECT/ -o PROJECT_ddp/ | --in-place [--diff] [--report-json R] [--zero-step keep]

The rewrite is source to source (LibCST): comments, formatting and every line without Horovod stay as written.
Each Horovod idiom has a rule that writes the DDP idiom docs/migrating-from-horovod.md gives for it. Porting a
script without Horovod (a DDP script, or a port) changes nothing.

A folder is ported whole: every Python file that uses Horovod, or that holds a model and optimizer wrapped in
another file (followed through the folder's own imports: the loop of `engine.train_epoch(model, optimizer)` gets its
no_sync there), into `-o OUT` (new or empty) with the rest of the tree copied, or `--in-place`; version control,
virtual environments, caches and run output are skipped and listed. One script whose folder's modules need the port
too is ported with what they tell it, and they are listed as left unported, with the command that ports the folder
(exit 1); `-o DIR/` ports the script's folder there.

Output: the port goes to `-o PATH` (`-` for stdout); without `-o`, beside the script, its name with "horovod"
or "hvd" replaced by "ddp" (train_horovod.py -> train_ddp.py), else with "_ddp" added. `--diff` prints a
unified diff instead of writing. The report goes to stdout (stderr when the port or the diff does).

`--report-json PATH` writes the report as JSON, the interface other tools build on (`compare-backends --port`
runs `python -m ddp_train.port SRC -o OUT --report-json R` and reads R):

    {"source": str, "output": str | null, "zero_step": "dropped" | "kept" | null, "seconds": float,
     "exit_code": int, "changes_training": bool,
     "changes": [{"line": int, "rule": str, "text": str, "changes_training": bool, "effect": str | null,
                  "cause": str | null, "file": str | null}],
     "unported": [{"line": int, "code": str, "reason": str, "file": str | null}],
     "files": [str], "copied": int, "skipped": [{"path": str, "why": str}]}

`file` is the path from the folder's root in the port of a folder (null for a script's own lines; `line` 0: the
whole file); `files`, `copied` and `skipped` are the port of a folder's.

A change's `line` is the Horovod script's; `changes_training` is true when the port can train differently beyond
rounding, `effect` says how (or, with `changes_training` false, how it rounds differently: not bitwise, within
the noise floor); `cause` is the quantity the comparison names where the two part because of it (e.g. "optimizer
steps before training", "gradients"). `ddp_train.port.report.from_json` reads the file back.

Exit codes: 0 everything ported; 1 something left unported (the port is written; each such line carries a
`# port: not ported: ...` comment and is listed); 2 bad input (a script that cannot be read or parsed, a bad
option), one line on stderr.
"""

from .context import Options
from .report import Change, PortReport, Unported
from .rewrite import PortError, Ported, port

__all__ = ["Change", "Options", "PortError", "PortReport", "Ported", "Unported", "port"]

"""``npformer exercises``: write the backward passes yourself, have them checked, then train the
toy translator with them (list, start DIR, check DIR [NAME], check DIR --train)."""
import argparse
import math

from ..exercises.catalogue import DERIVATIONS, EXERCISES, find
from ..exercises.checker import MAX_MEMORY, MAX_TIMEOUT, TIMEOUT, check_folder
from ..exercises.child import MEMORY, TRAIN_TIMEOUT
from .common import int_in, non_negative_int, positive_int, real_in

HINT_LEVELS = {1: "the idea", 2: "the formula"}     # --hint LEVEL; check alone: the symptom


def add_parser(sub, name):
    p = sub.add_parser(name, help="write each layer's backward pass yourself, check it, train with it",
                       description="Exercises: one file per layer with the forward pass given and "
                                   "the backward pass to write; a checker that compares your "
                                   "gradients with central differences and names the likely "
                                   "mistake; and a finale that trains the toy translator with "
                                   "your own backward passes.")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    actions.add_parser("list", help="the exercises, in order").set_defaults(run=run_list)
    start = actions.add_parser("start", help="write the exercise files into DIR",
                               description="Write one file per exercise into DIR (made if absent).")
    start.add_argument("dir", metavar="DIR")
    start.add_argument("--overwrite", action="store_true",
                       help="write into a folder that is not empty: the exercise files it lacks "
                            "are added, the files already there are kept (never overwritten)")
    start.add_argument("--notebook", action="store_true",
                       help="each exercise as a notebook too: NN_name.ipynb beside NN_name.py, "
                            "a jupytext pair (needs jupytext); check reads whichever of the "
                            "two was saved last")
    start.set_defaults(run=run_start)
    check = actions.add_parser("check", help="gradient-check your exercises (or train with them)",
                               description="Check every exercise of DIR (or NAME only): the "
                                           "gradient checker's per-entry report, the likely "
                                           "mistake where the error shows it, and a progress "
                                           "table. --train: the finale.")
    check.add_argument("dir", metavar="DIR")
    check.add_argument("name", metavar="NAME", nargs="?",
                       help=f"one exercise: {', '.join(e.name for e in EXERCISES)}")
    check.add_argument("--train", action="store_true",
                       help="the finale: train the toy translator of 'npformer toy' with your "
                            "backward passes (checks every exercise first)")
    check.add_argument("--epochs", type=positive_int, default=None,
                       help="with --train: epochs to train (default: the toy's 14)")
    check.add_argument("--seed", type=non_negative_int, default=0, help="with --train: the toy's seed")
    seconds = real_in(0, MAX_TIMEOUT, min_open=True)
    check.add_argument("--timeout", type=seconds, default=TIMEOUT,
                       help=f"seconds each exercise's check may take, at most {MAX_TIMEOUT:g} "
                            f"(default %(default)g)")
    check.add_argument("--train-timeout", type=seconds, default=None,
                       help=f"with --train: seconds the whole training may take (default "
                            f"{TRAIN_TIMEOUT:g})")
    check.add_argument("--memory", type=int_in(1, MAX_MEMORY), default=MEMORY, metavar="MIB",
                       help="MiB of memory your code may use, checks and training alike "
                            "(default %(default)d)")
    check.add_argument("--quiet", action="store_true", help="with --train: no per-epoch lines")
    check.add_argument("--hint", type=hint_level, nargs="?", const=1, default=0, metavar="LEVEL",
                       help="with NAME: say more about the mistake the check names: --hint "
                            "gives the idea, --hint 2 the formula (the check alone gives the "
                            "symptom and where to look)")
    check.set_defaults(run=run_check)


def hint_level(text):
    """--hint's level: 1 or 2."""
    if text.strip() not in {str(k) for k in HINT_LEVELS}:
        levels = " or ".join(f"{k} ({what})" for k, what in HINT_LEVELS.items())
        raise argparse.ArgumentTypeError(f"expected {levels}, got {text!r}")
    return int(text)


def run_list(args):
    print(f"{'#':>3s}  {'NAME':<22s} {'FILE':<28s} {'FINALE':<8s} {'TITLE':<50s} DERIVATION")
    for e in EXERCISES:
        print(f"{e.key:>3s}  {e.name:<22s} {e.file:<28s} {'trains' if e.trained else 'checked':<8s} "
              f"{e.title:<50s} {e.derivation}")
    print(f"\nderivations: {DERIVATIONS} in the folder that start writes, one section an "
          f"exercise\nstaged (4a, ...): the gradient of every named intermediate of the "
          f"layer, before the fused formula\nstart with: npformer exercises start DIR")
    return 0


def run_start(args):
    from ..exercises.templates import start
    written, kept = start(args.dir, overwrite=args.overwrite, notebook=args.notebook)
    print(f"wrote {len(written)} files into {args.dir}" + (
        f"; kept {len(kept)} already there: {', '.join(kept)}" if kept else ""))
    first = EXERCISES[0].notebook if args.notebook else EXERCISES[0].file
    print(f"next: open {args.dir}/{first}, write {EXERCISES[0].writes[0]}, then run\n"
          f"    npformer exercises check {args.dir} {EXERCISES[0].name}")
    return 0


def run_check(args):
    if args.train and args.name:
        raise ValueError("NAME: --train trains with every exercise; leave NAME out")
    if args.epochs is not None and not args.train:
        raise ValueError("--epochs: only with --train")
    if args.train_timeout is not None and not args.train:
        raise ValueError("--train-timeout: only with --train")
    if args.hint and (args.train or args.name is None):
        raise ValueError(f"--hint: only for one exercise: npformer exercises check {args.dir} "
                         f"NAME --hint")
    names = None if args.name is None else [find(args.name).name]
    results = check_folder(args.dir, names, timeout=args.timeout, memory=args.memory)
    if names and results[0].status in ("error", "timed out"):
        raise ValueError(results[0].message)              # one line, exit 1
    if args.hint and results[0].status == "done":
        print(f"{args.name} is done: no hint needed")
        return 0
    for r in results:
        print_result(r, args.hint)
    print_table(results)
    if not args.train:
        return 0 if all(r.status == "done" for r in results) else 1
    return run_train(args, results)


def print_result(r, level=0):
    """One exercise's report; ``level`` 1 or 2 adds the idea, then the formula, to each named
    mistake."""
    e = find(r.name)
    head = f"== {e.key}. {e.name} ({r.read or e.file}): {r.status}"
    if r.status != "done" and r.message:
        head += f": {r.message}"
    print(head)
    for label, text in r.reports:
        print(f"  {label}")
        print("\n".join("    " + line for line in text.splitlines()))
    for hint in r.hints:
        print(f"  likely mistake: {hint}")
        more = r.more.get(hint)
        if level and more:
            for word, text in list(zip(("idea", "formula"), more))[:level]:
                print(f"    {word}: {text}")
        elif level:
            print(f"    (no further hint for this one: follow {e.derivation} step by step)")
    if level < len(HINT_LEVELS) and any(h in r.more for h in r.hints):
        print(f"  more: --hint {level + 1} gives {HINT_LEVELS[level + 1]}")
    if level and not r.hints:
        print("  hint: " + ("none yet: the check names a mistake once your code runs" if
                            r.status == "not done" else "the check names no mistake here: "
                            "follow the derivation step by step"))
    if r.status == "WRONG":
        print(f"  derivation: {e.derivation}")
    print()


def print_table(results):
    done = sum(r.status == "done" for r in results)
    print(f"progress: {done} of {len(results)} done")
    print(f"  {'#':>3s}  {'exercise':<22s} {'status':<10s} {'worst error':>11s}  finale")
    for r in results:
        e = find(r.name)
        measured = r.worst is not None and r.status in ("done", "WRONG")
        worst = f"{r.worst:.1e}" if measured else r.note      # "shape": a gradient's shape
        print(f"  {e.key:>3s}  {e.name:<22s} {r.status:<10s} {worst:>11s}  "
              f"{'trains' if e.trained else 'checked'}")
    print()


def run_train(args, results):
    from ..exercises.finale import TARGET, refuse_unfinished, run_finale
    refuse_unfinished(results)
    wrong = [r.name for r in results if r.status == "WRONG"]
    if wrong:
        print(f"training anyway, although {', '.join(wrong)} "
              f"{'fails its' if len(wrong) == 1 else 'fail their'} checks: watch what happens")

    def on_eval(rec):
        if not args.quiet:
            print(f"epoch {rec['epoch']:3d}  step {rec['step']:5d}  valid loss {rec['loss']:.3f}  "
                  f"exact match {rec['exact_match']:.3f}", flush=True)

    print("the finale: training the toy translator (npformer toy) with your backward passes")
    result = run_finale(args.dir, seed=args.seed, epochs=args.epochs, on_eval=on_eval,
                        checks=results, timeout=args.timeout,
                        train_timeout=args.train_timeout or TRAIN_TIMEOUT,
                        memory=args.memory)
    if result.error:
        print(f"training stopped: {result.error}")
        _print_findings(result.findings)
        return 1
    if result.toy is not None:
        toy = result.toy
        print(f"train exact match    {toy.train_exact_match:.4f} ({toy.n_train} pairs)")
        print(f"held-out exact match {toy.heldout_exact_match:.4f} ({toy.n_heldout} pairs)")
        print(f"training took {toy.train_seconds:.1f} s ({toy.steps} steps, stopped by "
              f"{toy.stop_reason})")
        for zh, ref, hyp in toy.examples:
            mark = "ok" if hyp.split() == ref.split() else f"expected: {ref}"
            print(f"  {zh}\n    -> {hyp}   [{mark}]")
    if result.findings:
        print("training failed: a backward pass is wrong on a real batch of the toy's")
        _print_findings(result.findings)
        return 1
    if result.ok and result.toy.train_exact_match >= TARGET:
        print("your own backward passes trained the translator.")
        return 0
    if result.ok and args.epochs is not None:
        print(f"(fewer epochs than the toy's: exact match below {TARGET} is expected)")
        return 0
    if result.toy.stop_reason == "non_finite":
        print("training failed: the loss or the gradient became NaN or inf")
    else:
        print(f"training failed: train exact match below {TARGET}")
    print("  on a real batch your backward passes agree with the reference's; compare with "
          "npformer toy (the same seed)")
    return 1


def _print_findings(findings):
    """Which layer to look at: the first place the learner's backward disagreed with the
    reference's on a real batch, and how many other places each function did."""
    if not findings:
        return
    first = findings[0]
    print(f"look at {first.layer}: your {first.function} disagrees with the reference there "
          f"on a real training batch ({first.output} off by {_size(first.error)}"
          + (f"; {first.note}" if first.note else "") + ")")
    where = {}
    for f in findings[1:]:
        where.setdefault(f.function, set()).add(f.layer)
    if where:
        print("  also: " + "; ".join(f"{fn} at {len(ls)} more layer{'s' if len(ls) > 1 else ''}"
                                     for fn, ls in where.items()))
    print(f"  derivation: {find(_exercise_of(first.function)).derivation}")


def _size(error):
    return "more than 100%" if not math.isfinite(error) or error > 1 else f"{100 * error:.2g}%"


def _exercise_of(function):
    for e in EXERCISES:
        if function in e.provides:
            return e.name
    return EXERCISES[0].name


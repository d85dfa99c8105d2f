"""``npformer exercises``: write each layer's backward pass yourself. One file per layer with the
forward pass given and the backward pass to write (start DIR); a checker that compares your
gradients with central differences and names the likely mistake (check DIR [NAME]); and a
finale that trains the toy translator or a character model with your own backward passes
(check DIR --train [toy|gpt])."""
import argparse
import math

from ..exercises.catalogue import DERIVATIONS, EXERCISES, find
from ..exercises.checker import check_folder
from ..exercises.child import MAX_MEMORY, MAX_TIMEOUT, MEMORY, TIMEOUT, TRAIN_TIMEOUT
from ..exercises.gpt import CONFIG
from ..exercises.namespace import finales_of
from .common import command_parser, int_in, non_negative_int, positive_int, real_in

HINT_LEVELS = {1: "the idea", 2: "the formula"}     # --hint LEVEL; check alone: the symptom


def add_parser(sub, name):
    p = command_parser(sub, name, __doc__,
                       "write each layer's backward pass yourself, check it, train with it")
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
    check.add_argument("--train", nargs="?", const="toy", choices=("toy", "gpt"), default=None,
                       help="the finale (checks every exercise first): 'toy' (the default) "
                            "trains the toy translator of 'npformer toy' with your backward "
                            "passes; 'gpt' a small character model of tiny Shakespeare (npformer "
                            "download tinyshakespeare), beside the same run with the reference's")
    check.add_argument("--epochs", type=positive_int, default=None,
                       help="with --train toy: epochs to train (default: the toy's 14)")
    check.add_argument("--steps", type=positive_int, default=None,
                       help=f"with --train gpt: steps to train each run (default "
                            f"{CONFIG['steps']})")
    check.add_argument("--seed", type=non_negative_int, default=0,
                       help="with --train: the model's seed (and its batches')")
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
        print(f"{e.key:>3s}  {e.name:<22s} {e.file:<28s} {finales_of(e):<8s} "
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
    if args.epochs is not None and args.train != "toy":
        raise ValueError("--epochs: only with --train (toy)")
    if args.steps is not None and args.train != "gpt":
        raise ValueError("--steps: only with --train gpt")
    data = shakespeare() if args.train == "gpt" else None
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
    return run_train(args, results) if data is None else run_gpt(args, results, data)


def shakespeare():
    """The path of tiny Shakespeare's download (as ``npformer lm --data tinyshakespeare``
    finds it); ValueError with the one command that fetches it when it is not there."""
    from ..data.download import find_downloaded, resolve_data_dir
    path = find_downloaded("tinyshakespeare")
    if path is None:
        raise ValueError(f"--train gpt: tiny Shakespeare is not downloaded yet (no "
                         f"{resolve_data_dir() / 'tinyshakespeare.txt'}); fetch it with "
                         f"`npformer download tinyshakespeare`")
    return path


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
              f"{finales_of(e)}")
    print()


def warn_wrong(results):
    wrong = [r.name for r in results if r.status == "WRONG"]
    if wrong:
        print(f"training anyway, although {', '.join(wrong)} "
              f"{'fails its' if len(wrong) == 1 else 'fail their'} checks: watch what happens")


def run_train(args, results):
    from ..exercises.finale import refuse_unfinished, run_finale
    refuse_unfinished(results)
    warn_wrong(results)

    def on_eval(rec):
        if not args.quiet:
            print(f"epoch {rec['epoch']:3d}  step {rec['step']:5d}  valid loss {rec['loss']:.3f}  "
                  f"exact match {rec['exact_match']:.3f}", flush=True)

    print("the finale: training the toy translator (npformer toy) with your backward passes")
    result = run_finale(args.dir, seed=args.seed, epochs=args.epochs, on_eval=on_eval,
                        checks=results, timeout=args.timeout,
                        train_timeout=args.train_timeout or TRAIN_TIMEOUT,
                        memory=args.memory)
    return report_toy(result, args.epochs)


def report_toy(result, epochs=None):
    """Print the toy finale's :class:`FinaleResult` (what each function did on the real batch,
    the training's figures, the verdict); the exit status."""
    from ..exercises.finale import TARGET
    print_usage(result.usage, "the toy")
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
    if not verified(result):
        return 1
    if result.ok and result.toy.train_exact_match >= TARGET:
        print("your own backward passes trained the translator." + _unused_note(result.usage))
        return 0
    if result.ok and epochs is not None:
        print(f"(fewer epochs than the toy's: exact match below {TARGET} is expected)"
              + _unused_note(result.usage))
        return 0
    if result.toy.stop_reason == "non_finite":
        print("training failed: the loss or the gradient became NaN or inf")
    else:
        print(f"training failed: train exact match below {TARGET}")
    print("  on a real batch your backward passes agree with the reference's; compare with "
          "npformer toy (the same seed)")
    return 1


def run_gpt(args, results, data):
    from ..exercises.finale import refuse_unfinished, run_finale
    refuse_unfinished(results, "gpt")
    warn_wrong(results)

    def on_eval(rec):
        if not args.quiet:
            print(f"{rec['run']:<9s}  step {rec['step']:5d}  train loss {rec['loss']:.3f}",
                  flush=True)
    print(f"the finale: a character model of tiny Shakespeare ({data}) trained with your "
          f"passes, then the same run with the reference's")
    result = run_finale(args.dir, seed=args.seed, on_eval=on_eval, checks=results,
                        timeout=args.timeout, train_timeout=args.train_timeout or TRAIN_TIMEOUT,
                        memory=args.memory, finale="gpt", data=data, steps=args.steps)
    return report_gpt(result)


def report_gpt(result):
    """Print the GPT finale's :class:`FinaleResult`: what each function did on the real step,
    the validation loss and a sample before training and after each run, the verdict."""
    print_usage(result.usage, "the character model")
    if result.error:
        print(f"training stopped: {result.error}")
        _print_findings(result.findings)
        return 1
    g = result.gpt
    print(f"validation loss before training {g['before']['valid_loss']:.3f}; after "
          f"{g['steps']} steps: yours {g['yours']['valid_loss']:.3f}, the reference's "
          f"{g['reference']['valid_loss']:.3f} ({g['yours']['seconds']:.0f} s and "
          f"{g['reference']['seconds']:.0f} s)")
    for label, key in (("before training", "before"), ("after, your passes", "yours"),
                       ("after, the reference passes", "reference")):
        print(f"--- sample {label} ---")
        print(g[key]["sample"])
    print("---")
    if not verified(result):
        return 1
    if not math.isfinite(g["yours"]["valid_loss"]):
        print("training failed: the loss became NaN or inf")
        return 1
    print("your own passes trained the character model." + _unused_note(result.usage))
    return 0


def print_usage(usage, model):
    """What each of the learner's functions did on a real training batch of ``model``."""
    if not usage:
        return
    print(f"your functions on a real training batch of {model} (one step, each beside the "
          f"reference's on the same inputs):")
    for status in ("agreed", "wrong", "not compared", "not used"):
        group = [u for u in usage if u.status == status]
        if status == "not used":
            for u in group:
                print(f"  {'not used':<12s} {u.function}: {u.reason}; not trained with")
        elif group:
            items = [f"{u.function} ({u.calls} call{'s' if u.calls != 1 else ''})" for u in group]
            lines = [f"  {status:<12s}"]
            for i, item in enumerate(items):
                item += "," if i < len(items) - 1 else ""
                if len(lines[-1]) + 1 + len(item) > 100:
                    lines.append(" " * 14)
                lines[-1] += " " + item
            print("\n".join(lines))
    print()


def verified(result):
    """True when every function that ran agreed with the reference on the real batch;
    otherwise the verdict (what agreed, what did not, the first wrong one) and False."""
    usage, findings = result.usage, result.findings
    if not findings and all(u.status in ("agreed", "not used") for u in usage):
        return True
    agreed = [u.function for u in usage if u.status == "agreed"]
    unjudged = [u.function for u in usage if u.status == "not compared"]
    print("training failed: " + ("a function of yours is wrong on a real training batch"
                                 if findings else "not every function of yours could be "
                                 "compared with the reference: " + ", ".join(unjudged)))
    _print_findings(findings)
    if agreed:
        print(f"  agreed with the reference: {', '.join(agreed)}")
    print("  a wrong gradient can still lower the loss: the figures above say the model "
          "fitted its data, not that your gradients are right")
    return False


def _unused_note(usage):
    unused = [u.function for u in usage if u.status == "not used"]
    return ("" if not unused else f" Not trained with (not used by your other code): "
            f"{', '.join(unused)}.")


def _print_findings(findings):
    """Which function to look at: the first place, in the order the step ran (the forward,
    then the backward from the loss down, a callee before its caller), where the learner's
    function disagreed with the reference's on a real batch, and how many other places each
    function did."""
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


"""The training example (doc/examples/train_digits.py) as a test: on 4 ranks it reaches a test
accuracy of at least 90 % in its 10 epochs and every rank ends with the same weights; one
rank trained alone the same way (the same batches, so the same model but for rounding) has
the test accuracy of 4 ranks after every epoch, within a point; and 4 ranks with the
gradients compressed to int8 (error feedback) end within a point of one rank too, with at most
a third of the bytes on the wire. Skips (77) without torch or scikit-learn (Debian's
python3-torch, python3-sklearn)."""
import os
import re
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "doc",
                       "examples", "train_digits.py")
BOUND = 90.0


def run(ranks, *extra):
    try:
        p = subprocess.run([sys.executable, EXAMPLE, "--ranks", str(ranks)] + list(extra),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=240)
    except subprocess.TimeoutExpired as e:
        sys.exit("--ranks %d: still running after 240 s:\n%s" % (ranks, e.output))
    print("--- --ranks %d (exit %d):\n%s" % (ranks, p.returncode, p.stdout), flush=True)
    if p.returncode:
        sys.exit("--ranks %d failed" % ranks)
    acc = re.findall(r"^accuracy (\d+(?:\.\d+)?)$", p.stdout, re.M)
    if len(acc) != 1:
        sys.exit("--ranks %d: no line 'accuracy <percent>'" % ranks)
    epochs = [float(a) for a in re.findall(r"test accuracy (\d+(?:\.\d+)?)%", p.stdout)]
    return float(acc[0]), epochs, p.stdout


def main():
    for module in ("torch", "sklearn"):
        try:
            __import__(module)
        except ImportError:
            print("SKIP: no %s for %s" % (module, sys.executable))
            sys.exit(77)
    acc4, epochs4, out4 = run(4)
    if acc4 < BOUND:
        sys.exit("4 ranks: accuracy %.2f %% < %.0f %%" % (acc4, BOUND))
    if "replicas in sync: yes" not in out4:
        sys.exit("4 ranks: the replicas' weights differ")
    acc1, epochs1, _ = run(1)
    if len(epochs4) != len(epochs1) or not epochs1 or \
            any(abs(a - b) > 1.0 for a, b in zip(epochs4, epochs1)):
        sys.exit("test accuracy per epoch: 4 ranks %s, one rank %s" % (epochs4, epochs1))
    accz, _, outz = run(4, "--compress", "int8")
    if abs(accz - acc1) > 1.0 or "replicas in sync: yes" not in outz:
        sys.exit("4 ranks with int8: accuracy %.2f %% (one rank %.2f %%), or replicas differ"
                 % (accz, acc1))
    wire = [int(re.search(r"^wire bytes (\d+)", o, re.M).group(1)) for o in (out4, outz)]
    if not 0 < wire[1] * 3 <= wire[0]:
        sys.exit("int8 put %d bytes on the wire, uncompressed %d" % (wire[1], wire[0]))
    print("accuracy: 4 ranks %.2f %%, 1 rank %.2f %%, 4 ranks with int8 %.2f %%; wire bytes "
          "%d, with int8 %d" % (acc4, acc1, accz, wire[0], wire[1]))


if __name__ == "__main__":
    main()

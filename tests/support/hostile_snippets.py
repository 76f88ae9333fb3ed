"""Hostile python-tool snippets shared by the sandbox tests and `bench/bench_python_sandbox_limits.py`."""

from __future__ import annotations

from pathlib import Path


def litter(victim: Path) -> str:
    """A snippet that leaves what `shutil.rmtree` cannot remove: a chain deeper than its recursion (1100 levels)
    and longer than ``PATH_MAX`` (10 more levels of 250-character names), locked dirs, a symlink out."""
    return (
        "import os\n"
        "os.mkdir('locked'); open('locked/f', 'w').write('x'); os.chmod('locked', 0)\n"
        "os.mkdir('readonly'); open('readonly/f', 'w').write('x'); os.chmod('readonly', 0o500)\n"
        f"try:\n    os.symlink({str(victim)!r}, 'victim')\nexcept PermissionError:\n    pass  # the hook's refusal\n"
        "os.mkdir('deep'); os.chdir('deep')\n"
        "try:\n"
        "    for name in ['d'] * 1100 + ['x' * 250] * 10:\n"
        "        os.mkdir(name); os.chdir(name)\n"
        "    open('bottom', 'w').write('x'); os.chmod('.', 0o500)\n"
        "    print('built')\n"
        "except PermissionError as error:  # the hook past PATH_MAX without namespaces (getcwd cannot list up)\n"
        "    print('built up to the refusal:', error)\n"
    )


# looks, for 1 s, for a file named secret.txt in every work dir it can name (beside its own, or through /proc)
SEEKER = """import os, re, time
root = os.path.dirname(os.getcwd())
found, looked = set(), 0
deadline = time.time() + 1.0
while time.time() < deadline:
    places = set()
    try:
        places.update(os.path.join(root, name) for name in os.listdir(root))
    except OSError:
        pass
    for pid in filter(str.isdigit, os.listdir('/proc')):
        places.add(f'/proc/{pid}/cwd')
        try:
            command = open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace')
        except OSError:
            continue
        places.update(re.findall(re.escape(root) + r'/agent-env-python-[A-Za-z0-9_]+', command))
    for place in places:
        looked += 1
        try:
            found.add(open(os.path.join(place, "secret.txt")).read() + place)
        except OSError:
            pass
    time.sleep(0.05)
print('looked', looked > 0, 'found', sorted(found))
"""

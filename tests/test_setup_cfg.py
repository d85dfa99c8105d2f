"""setup.cfg against the tree: every package folder is listed (and every listed one exists),
and every file a package needs that is not Python is package data, so that a fresh install
never lacks one (the exercise folder's README, say)."""
import configparser
import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def read_setup():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    options = config["options"]
    packages = {p.strip() for p in options["packages"].split() if p.strip()}
    package_dir = {}
    for line in options.get("package_dir", "").strip().splitlines():
        name, _, folder = line.partition("=")
        package_dir[name.strip()] = folder.strip()
    data = {}
    if config.has_section("options.package_data"):
        for name, globs in config["options.package_data"].items():
            data[name] = [g.strip() for g in globs.replace(",", " ").split() if g.strip()]
    return packages, package_dir, data


def folder_of(package, package_dir):
    if package in package_dir:
        return ROOT / package_dir[package]
    for parent in sorted(package_dir, key=len, reverse=True):      # a mapped package's child
        if package.startswith(parent + "."):
            return ROOT / package_dir[parent] / Path(*package[len(parent) + 1:].split("."))
    return ROOT / Path(*package.split("."))


def tree_packages(package_dir):
    """Dotted names of every folder with an __init__.py under npformer/ and the mapped ones."""
    found = set()
    roots = [("npformer", ROOT / "npformer"),
             *((name, ROOT / folder) for name, folder in package_dir.items())]
    for name, folder in roots:
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder)
            found.add(".".join([name, *rel.parts]))
    return found


def test_every_package_folder_is_listed_and_every_listed_package_exists():
    packages, package_dir, _ = read_setup()
    assert packages == tree_packages(package_dir)
    for package in packages:
        assert (folder_of(package, package_dir) / "__init__.py").is_file(), package
    assert package_dir.get("npformer.kernels") == "kernels"


def test_every_non_python_file_of_a_package_is_package_data():
    packages, package_dir, data = read_setup()
    for package in packages:
        folder = folder_of(package, package_dir)
        globs = data.get(package, [])
        for glob in globs:                              # no pattern that matches nothing
            assert list(folder.glob(glob)), f"{package}: package data {glob} matches no file"
        sub = {folder_of(p, package_dir) for p in packages} - {folder}
        for path in folder.rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".py", ".pyc"):
                continue
            if any(parent in sub for parent in path.parents):
                continue                                # another package's file
            rel = path.relative_to(folder).as_posix()
            assert any(fnmatch.fnmatch(rel, g) for g in globs), \
                f"{package}: {rel} is not in setup.cfg's [options.package_data]"

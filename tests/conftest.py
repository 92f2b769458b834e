"""Session setup shared by every test module: hypothesis profiles (see docs/testing.md, "Hypothesis").

``ci`` is derandomized: the same examples every run, so a red CI run is red again on a laptop.
``explore`` (the default outside CI) draws new examples each run and keeps failures in .hypothesis/.
``HYPOTHESIS_PROFILE=<name>`` picks one explicitly; otherwise ``CI`` set (as .ci/run does) means ``ci``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hypothesis import settings

# deadline=None in both: 2 shared cores make a 200 ms deadline a flake, not a finding.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None)


def profile_name(environ: Mapping[str, str]) -> str:
    """The profile a run with ``environ`` uses."""
    explicit = environ.get("HYPOTHESIS_PROFILE", "").strip()
    if explicit:
        return explicit
    ci = environ.get("CI", "").strip().lower()
    return "ci" if ci not in ("", "0", "false", "no") else "explore"


# Loaded at import, before any test module: a module's @settings(...) takes the loaded profile as its
# parent when it is decorated, overriding only the keys it names.
settings.load_profile(profile_name(os.environ))

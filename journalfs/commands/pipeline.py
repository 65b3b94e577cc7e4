"""`journalfs pipeline INPUT OUTPUT`: journals -> Parquet tables with Spark.

Everything a user can get wrong is checked before Spark starts (paths, sizes, a master that
does not answer). Spark's own console output goes to a log file, named when something fails;
the user sees a progress line per stage, a summary, and one line per error. OUTPUT is written
as a whole: the tables appear there only when every one of them is complete.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from pyarrow import fs
from rich.console import Console

from ..options import DEFAULT_DRIVER_GIB
from ..spark.plan import NoJournalError, list_journals, local_path
from ..spark.storage import is_remote, s3_filesystem, s3_options, split_s3
from . import EXIT_DAMAGED, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE


class Terminated(BaseException):
    """SIGTERM arrived: stop Spark as for Ctrl-C (a JVM left behind would keep running)."""


def _terminate(_signum, _frame):
    raise Terminated()


class PipelineError(Exception):
    """A problem found before or while running, reported as one line."""

    def __init__(self, message: str, code: int = EXIT_ERROR):
        super().__init__(message)
        self.code = code


def run(args) -> int:
    # Spark's console output (the driver JVM's from its start) goes to this log
    log = tempfile.mkstemp(prefix="journalfs-pipeline-", suffix=".log")
    early = None
    try:
        output = check_paths(args.input, args.output, args.overwrite)
        unreadable: list[tuple[str, str]] = []
        files = list_input(args.input, unreadable)
        if args.master and args.master.startswith("spark://"):
            check_master(args.master, args.master_timeout)
        # past every check a user can fail quickly: the JVM starts while the rest loads
        early = EarlyDriver.start(args, log[0])
        jvm_bytes = jvm_input_bytes(files)
        archive = class_archive(jvm_bytes)
        conf = spark_conf(args, jvm_bytes, archive)
    except BaseException as exc:
        if early is not None:
            early.discard()
        os.close(log[0])
        os.unlink(log[1])
        if not isinstance(exc, PipelineError):
            raise
        print(f"journalfs: pipeline: {exc}", file=sys.stderr)
        return exc.code
    return _run_spark(args, output, conf, (files, unreadable), archive, log, early)


class EarlyDriver:
    """The driver JVM, started in a thread once INPUT is listed and checked, while the
    pipeline's modules load and its settings are worked out (the JVM's start-up would
    otherwise wait for them), with the settings of a short job; the run uses it when its
    settings turn out the same (they are the JVM's system properties), else stops it and
    starts its own."""

    def __init__(self, options: dict[str, str], stderr: int):
        self.options = options
        self.gateway = None
        self.adopted = False
        self._thread = threading.Thread(target=self._launch, args=(stderr,), daemon=True,
                                        name="driver-jvm")
        self._thread.start()

    @classmethod
    def start(cls, args, stderr: int) -> "EarlyDriver | None":
        """None where pyspark would not start a JVM itself (it is given one's port)."""
        if "PYSPARK_GATEWAY_PORT" in os.environ:
            return None
        # pyspark (as in jvm_input_bytes), loaded on this thread before the JVM's starts:
        # two threads importing it at once can meet a partially initialised module
        import pyspark.core.context  # noqa: F401  (what SparkConf loads)
        import pyspark.java_gateway  # noqa: F401
        return cls(run_options(args, spark_conf(args, 0, class_archive(0))), stderr)

    def _launch(self, stderr: int) -> None:
        from ..spark.session import launch_driver  # loaded by run_options, on the main thread
        try:
            self.gateway = launch_driver(self.options, stderr)
        except Exception:  # e.g. no java: the run's own start says why, in its log
            self.gateway = None

    def adopt(self, options: dict[str, str]) -> bool:
        """Whether the session about to be built with ``options`` will use this JVM."""
        self._thread.join()
        if self.gateway is None or options != self.options:
            self.discard()
            return False
        from ..spark.session import adopt_driver  # pyspark, as in jvm_input_bytes
        adopt_driver(self.gateway)
        self.adopted = True
        return True

    def discard(self) -> None:
        """Stop the JVM unless a session uses it (then ``spark.stop()`` does)."""
        self._thread.join()
        gateway, self.gateway = self.gateway, None
        if gateway is None or self.adopted:
            return
        with contextlib.suppress(Exception):
            gateway.close()
        proc = gateway.proc
        with contextlib.suppress(OSError):
            proc.stdin.close()  # the JVM exits when its stdin closes
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_options(args, conf: dict[str, str]) -> dict[str, str]:
    """Every setting of the run's session (what its driver JVM is started with)."""
    # pyspark, as in jvm_input_bytes
    from ..spark.session import PIPELINE_APP, pipeline_settings, session_options
    return session_options(args.master or "local[*]", PIPELINE_APP, pipeline_settings(conf))


def list_input(input_path: str, unreadable: list | None = None):
    """The journals of INPUT, listed (by content) before Spark starts: an input holding none
    is refused in one line rather than turned into empty tables. ``unreadable`` collects
    the paths that could not be read (named in the summary)."""
    try:
        return list_journals(input_path, required=True, unreadable=unreadable,
                             storage=s3_options() if is_remote(input_path) else ())
    except (NoJournalError, OSError, ValueError) as exc:
        raise PipelineError(_reason(exc)) from None


def _reason(exc: Exception) -> str:
    """An error's text without "[Errno N]" (our own messages name the path already)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror if exc.filename is None and "/" in exc.strerror else \
            f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)


# -- checks before Spark starts ---------------------------------------------------------------

def check_paths(input_path: str, output: str, overwrite: bool) -> str:
    """The absolute OUTPUT, after refusing what would fail later or lose data."""
    remote = is_remote(input_path)
    try:
        input_path = input_path if remote else local_path(input_path)
    except (OSError, ValueError) as exc:
        raise PipelineError(_reason(exc)) from None
    if not remote and not os.access(input_path, os.R_OK):
        raise PipelineError(f"{input_path}: permission denied")
    if is_remote(output):
        return check_remote_output(output, overwrite)
    output = os.path.abspath(output)
    if os.path.exists(output) or os.path.islink(output):
        if not os.path.isdir(output) or os.path.islink(output):
            raise PipelineError(f"{output}: exists and is not a directory; give a directory "
                                "for the tables", EXIT_USAGE)
        if os.listdir(output) and not overwrite:
            raise PipelineError(f"{output}: already holds files (an earlier run?); pass "
                                "--overwrite to replace them", EXIT_USAGE)
        if not remote and _inside(os.path.realpath(input_path), os.path.realpath(output)):
            raise PipelineError(f"{output}: holds the input; choose another OUTPUT", EXIT_USAGE)
    parent = os.path.dirname(output)
    if not os.path.isdir(parent):
        raise PipelineError(f"{parent}: no such directory (OUTPUT's parent must exist)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PipelineError(f"{parent}: permission denied (cannot create {os.path.basename(output)})")
    return output


def check_remote_output(output: str, overwrite: bool) -> str:
    """An s3:// OUTPUT: its bucket must exist; a prefix that holds objects needs --overwrite."""
    try:
        _scheme, bucket, key = split_s3(output)
        if not key:
            raise PipelineError(f"{output}: give a prefix inside the bucket (s3://BUCKET/PREFIX)",
                                EXIT_USAGE)
        remote = s3_filesystem(s3_options())
        if remote.get_file_info(bucket).type == fs.FileType.NotFound:
            raise PipelineError(f"{output}: no such bucket")
        info = remote.get_file_info(f"{bucket}/{key}")
        if info.type == fs.FileType.File:
            raise PipelineError(f"{output}: an object, not a prefix; give a prefix for the "
                                "tables", EXIT_USAGE)
        if info.type == fs.FileType.Directory and not overwrite and remote.get_file_info(
                fs.FileSelector(f"{bucket}/{key}", recursive=False)):
            raise PipelineError(f"{output}: already holds objects (an earlier run?); pass "
                                "--overwrite to replace them", EXIT_USAGE)
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{output}: {_reason(exc)}") from None
    return output


def upload_tables(local: str, output: str) -> None:
    """The finished tables (written locally by Spark) to an s3:// OUTPUT with pyarrow's
    multi-threaded uploads, after removing what --overwrite allowed to replace. pyspark
    ships no hadoop-aws, so Spark cannot write there itself."""
    _scheme, bucket, key = split_s3(output)
    remote = s3_filesystem(s3_options())
    if remote.get_file_info(f"{bucket}/{key}").type == fs.FileType.Directory:
        remote.delete_dir_contents(f"{bucket}/{key}", missing_dir_ok=True)
    for d, dirs, files in os.walk(local):  # Spark's checksum files stay behind
        for name in files:
            if name.startswith(".") and name.endswith(".crc"):
                os.unlink(os.path.join(d, name))
    fs.copy_files(local, f"{bucket}/{key}", source_filesystem=fs.LocalFileSystem(),
                  destination_filesystem=remote, use_threads=True)


def _inside(path: str, directory: str) -> bool:
    return os.path.commonpath([path, directory]) == directory


def default_driver_memory() -> str:
    """:data:`DEFAULT_DRIVER_GIB`, or a quarter of the machine's RAM when that is less (never
    under 1 GiB)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return f"{DEFAULT_DRIVER_GIB}g"
    return f"{max(1, min(DEFAULT_DRIVER_GIB, total // 4 >> 30))}g"


#: Inputs whose JVM-side journals (:func:`jvm_input_bytes`) are below this are "short jobs":
#: the JVMs' start-up and JIT warm-up cost more than their work, so only the C1 compiler and
#: the serial GC, and few shuffle partitions.
SMALL_INPUT_BYTES = 256 << 20
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Below this, whole-stage code generation costs more CPU than running the few rows
#: interpreted; above, `persistence` of a 150 MB akka journal took 13.5 s with it and 15.6 s
#: without (10.4 and 14.7 s warm).
INTERPRETED_BYTES = 16 << 20


def jvm_input_bytes(files) -> int:
    """The bytes of the journals whose records the JVM works on: those of the tables Spark
    computes from the records' Parquet. The records themselves (and the tables of the same
    pass) are decoded and written by Python workers and never become JVM rows, so a big
    input of other formats is still a short job for the JVM."""
    # pyspark (optional: the spark extra) is loaded once the input passed the checks above
    # (a wrong path is refused without it); spark.derived, .classarchive, .pipeline use it
    from ..spark import derived
    from ..spark.pipeline import replayed_here
    formats = {fmt for name, fmts in derived.TABLES.items() if name not in derived.IN_PASS
               for fmt in fmts}
    # a few small gvfs stores are replayed by the driver's Python, not in the JVM
    return 0 if replayed_here(files) else sum(f.size for f in files if f.format in formats)


def class_archive(input_bytes: int):
    """The driver JVM's class-data archive for a short job (None for a long one, whose
    start-up matters little, or when ``JOURNALFS_SPARK_CDS=0``)."""
    if input_bytes >= SMALL_INPUT_BYTES or os.environ.get("JOURNALFS_SPARK_CDS", "1") == "0":
        return None
    from ..spark.classarchive import ClassArchive  # pyspark, as in jvm_input_bytes
    return ClassArchive(QUICK_JVM)


def spark_conf(args, input_bytes: int = 0, archive=None) -> dict[str, str]:
    """Spark settings: journalfs's defaults for this input's size, then the user's."""
    conf = {"spark.driver.memory": args.driver_memory or default_driver_memory()}
    if input_bytes < SMALL_INPUT_BYTES:
        driver_jvm = f"{QUICK_JVM} {archive.java_options()}".strip() if archive else QUICK_JVM
        conf.update({"spark.driver.extraJavaOptions": driver_jvm,
                     "spark.executor.extraJavaOptions": QUICK_JVM,
                     "spark.sql.shuffle.partitions": "2"})
        if input_bytes < INTERPRETED_BYTES:
            conf["spark.sql.codegen.wholeStage"] = "false"
    if args.executor_memory:
        conf["spark.executor.memory"] = args.executor_memory
    conf.update(dict(args.conf))
    return conf


def check_master(url: str, timeout: float) -> None:
    """Refuse a standalone master that does not accept a TCP connection within ``timeout``
    (Spark itself retries for minutes and prints hundreds of lines)."""
    hosts = url[len("spark://"):].split(",")
    reasons = []
    deadline = time.monotonic() + timeout
    while True:
        for host_port in hosts:
            host, _, port = host_port.rpartition(":")
            if not host or not port.isdigit():
                raise PipelineError(f"{url}: not a master URL (spark://HOST:PORT)", EXIT_USAGE)
            try:
                with socket.create_connection((host.strip("[]"), int(port)),
                                              timeout=max(1.0, min(5.0, timeout))):
                    return
            except OSError as exc:
                reasons.append(exc.strerror or str(exc) or type(exc).__name__)
        if time.monotonic() + 1 >= deadline:
            break
        time.sleep(1)
    raise PipelineError(f"cannot reach the Spark master at {url} within {timeout:g} s "
                        f"({reasons[-1].lower()}); is it running?")


# -- running ------------------------------------------------------------------------------------

def _run_spark(args, output: str, conf: dict[str, str], listing=None, archive=None,
               log: tuple[int, str] | None = None, early: EarlyDriver | None = None) -> int:
    """Run the job with Spark's console output in a log file (``log``: its open descriptor
    and path) and SIGINT handled: Ctrl-C cancels the jobs, stops Spark and exits 130;
    nothing half-written is left in OUTPUT. ``early``: a driver JVM started already."""
    fd, log_path = log or tempfile.mkstemp(prefix="journalfs-pipeline-", suffix=".log")
    remote_output = is_remote(output)
    if remote_output:  # written here, uploaded when complete
        partial = os.path.join(tempfile.gettempdir(), f"journalfs-pipeline-output-{os.getpid()}")
    else:
        partial = os.path.join(os.path.dirname(output),
                               f".{os.path.basename(output)}.journalfs-partial-{os.getpid()}")
    spark = None
    code, message = EXIT_ERROR, None
    with _stderr_to(fd) as console, \
            tempfile.TemporaryDirectory(prefix="journalfs-pipeline-") as scratch:
        try:
            # pyspark, as in jvm_input_bytes
            from ..spark.pipeline import print_summary, run as run_pipeline, spark_for
            if early is not None:
                early.adopt(run_options(args, conf))
            spark = spark_for(args.master, scratch, conf)
            # PySpark's own handler calls into the JVM from inside the signal handler (a
            # reentrant py4j call that fails noisily); a plain KeyboardInterrupt instead, and
            # the jobs are cancelled below
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, _terminate)
            if args.master and not args.master.startswith("local"):
                wait_for_executors(spark, args.master, args.master_timeout)
            files, unreadable = listing or (None, [])
            summary = run_pipeline(spark, args.input, partial, console, files=files)
            summary.unreadable = unreadable
            _stop(spark)
            spark = None
            if archive is not None:  # none yet: made in the background, for the next runs
                archive.make_later()
            if remote_output:
                upload_tables(partial, output)
            else:
                _swap_into_place(partial, output)
            summary.output = output
            print_summary(summary, console)
            # the contract's exit status for damage; the tables are written all the same
            code = EXIT_DAMAGED if summary.damaged_files else EXIT_OK
        except KeyboardInterrupt:
            code, message = EXIT_INTERRUPTED, "interrupted; Spark stopped, nothing written"
        except Terminated:
            code, message = EXIT_TERMINATED, "terminated; Spark stopped, nothing written"
        except PipelineError as exc:
            code, message = exc.code, str(exc)
        except Exception as exc:  # Spark/Java failures: one line here, the rest in the log
            message = f"{_first_line(exc)} (Spark's log: {log_path})"
            with contextlib.suppress(Exception):  # fd 2 is Spark's log here: the whole story
                os.write(2, f"journalfs: pipeline failed: {exc}\n".encode("utf-8", "replace"))
        finally:
            with _no_interrupts():
                if spark is not None:
                    _stop(spark)
                if early is not None:
                    early.discard()
                shutil.rmtree(partial, ignore_errors=True)
    if message:
        print(f"journalfs: pipeline: {message}", file=sys.stderr)
    if code in (EXIT_OK, EXIT_DAMAGED, EXIT_INTERRUPTED, EXIT_TERMINATED):
        with contextlib.suppress(OSError):
            os.unlink(log_path)
    return code


def wait_for_executors(spark, master: str, timeout: float) -> None:
    """A cluster whose workers are down (or too small for the app) accepts the app but never
    runs a task: say so instead of waiting forever."""
    tracker = spark.sparkContext._jsc.sc()
    deadline = time.monotonic() + timeout
    while tracker.getExecutorMemoryStatus().size() < 2:  # the driver counts as one
        if time.monotonic() > deadline:
            raise PipelineError(f"no executor joined within {timeout:g} s on {master} (are its "
                                "workers running, with the memory and cores asked for?)")
        time.sleep(0.5)


def _stop(spark) -> None:
    with contextlib.suppress(Exception):
        spark.sparkContext.cancelAllJobs()
    with contextlib.suppress(Exception):
        spark.stop()


def _swap_into_place(partial: str, output: str) -> None:
    """Put the finished tables at ``output``, replacing what --overwrite allowed to replace."""
    old = None
    if os.path.lexists(output):
        old = f"{partial}-old"
        os.rename(output, old)
    os.rename(partial, output)
    if old:
        shutil.rmtree(old, ignore_errors=True)


#: What our own executor-side errors say (read.UnreadableSlice), found in Spark's wrapping.
#: (the exception's own line of the worker's traceback, not the source line quoted above it)
_OWN_ERROR = re.compile(r"UnreadableSlice: (?:\[Errno \d+\] )?journalfs: (cannot read [^\n]*)")


def _first_line(exc: BaseException) -> str:
    java = getattr(exc, "java_exception", None)
    text = ""
    if java is not None:
        with contextlib.suppress(Exception):
            text = str(java.toString())
    text = text or str(exc) or type(exc).__name__
    own = _OWN_ERROR.search(str(exc)) or _OWN_ERROR.search(text)
    if own:  # a task failed for a reason of ours (after Spark's retries): that reason
        return own.group(1).strip()[:500]
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return type(exc).__name__


@contextlib.contextmanager
def _stderr_to(log_fd: int):
    """Point file descriptor 2 (inherited by the JVM and Python workers) at the log, and give
    back a rich console on the real stderr for our own progress and summary."""
    sys.stderr.flush()
    saved = os.dup(2)
    ours = os.fdopen(os.dup(saved), "w", buffering=1, errors="backslashreplace")
    os.dup2(log_fd, 2)
    os.close(log_fd)
    old_stderr = sys.stderr
    sys.stderr = ours
    # py4j reports a broken call (Ctrl-C in the middle of one) through logging: to the log
    log = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
    handler = logging.StreamHandler(log)
    logging.getLogger().addHandler(handler)
    try:
        yield Console(file=ours)
    finally:
        logging.getLogger().removeHandler(handler)
        log.close()
        sys.stderr = old_stderr
        os.dup2(saved, 2)
        os.close(saved)
        ours.close()


@contextlib.contextmanager
def _no_interrupts():
    """A second Ctrl-C while Spark stops must not leave it half stopped with a traceback."""
    try:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

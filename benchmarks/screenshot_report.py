"""Screenshot a report.html in headless Chromium with no network, to check it renders.

    python benchmarks/screenshot_report.py reports/report.html out.png [--height 3000]

Needs Debian's ``chromium`` (``apt-get install -y chromium``). The report is
self-contained, so the page must render fully with every network feature off.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(html_path: str, png_path: str, width: int = 1400, height: int = 3000,
               timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as profile:
        cmd = [exe, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={os.path.abspath(png_path)}",
               f"--window-size={width},{height}", "file://" + os.path.abspath(html_path)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html")
    parser.add_argument("png")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=3000)
    args = parser.parse_args()
    proc = screenshot(args.html, args.png, args.width, args.height)
    if proc.returncode != 0 or not os.path.exists(args.png):
        print(proc.stderr, file=sys.stderr)
        return 1
    print(f"wrote {args.png} ({os.path.getsize(args.png)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checks every internal link of a built site: each ``href``/``src`` that is not external must name a file of
the site, and its ``#fragment`` an ``id`` on that page.

    python docs/check_links.py SITE_DIR

``mkdocs build --strict`` already refuses a Markdown link to a missing page or anchor; this reads the HTML it
wrote, so it also covers links in included files and in the theme. Hand-written with the standard library's
HTML parser (about forty lines) rather than a link-checker package: the site is local files, no network is
wanted, and the checkers on PyPI crawl over HTTP.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name in ("href", "src") and value and tag in ("a", "img", "link", "script"):
                self.links.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(errors="replace"))
    return page


def broken(site: Path) -> list[str]:
    """Every internal link of the site's HTML pages whose file or anchor does not exist."""
    pages = {p: _parse(p) for p in site.rglob("*.html")}
    bad = []
    for path, page in pages.items():
        for link in page.links:
            url = urlsplit(link)
            if url.scheme or url.netloc or link.startswith(("mailto:", "data:")):
                continue
            # an absolute path (the theme's 404 page uses them) is relative to the site's root
            base = site if url.path.startswith("/") else path.parent
            target = (base / unquote(url.path).lstrip("/")).resolve() if url.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                bad.append(f"{path.relative_to(site)}: {link} (no such file)")
            elif url.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(url.fragment) not in ids:
                    bad.append(f"{path.relative_to(site)}: {link} (no such anchor)")
    return bad


def main(argv: list[str]) -> int:
    site = Path(argv[0]).resolve()
    bad = broken(site)
    for b in bad:
        print(f"broken link: {b}", file=sys.stderr)
    print(f"{sum(1 for _ in site.rglob('*.html'))} pages checked, {len(bad)} broken internal links")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

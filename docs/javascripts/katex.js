// The site's math, rendered in the reader's browser by the KaTeX copy in docs/vendor/katex, so
// that it renders with the network off. The Markdown pages are written with $...$ (inline) and
// $$...$$ (displayed), which pymdownx.arithmatex (generic mode) hands over as \(...\) and \[...\]
// inside .arithmatex elements; the tutorials' notebook cells keep the $...$ and $$...$$ that
// Jupyter renders, so their Markdown cells are read with those delimiters as well.
const MATH_DELIMITERS = [
  {left: "$$", right: "$$", display: true},
  {left: "\\[", right: "\\]", display: true},
  {left: "$", right: "$", display: false},
  {left: "\\(", right: "\\)", display: false},
];

function renderMath() {
  const places = document.querySelectorAll(".arithmatex, .jp-MarkdownCell .jp-RenderedMarkdown");
  for (const place of places) {
    // throwOnError: false shows a formula that KaTeX cannot read as red source, never a blank
    renderMathInElement(place, {delimiters: MATH_DELIMITERS, throwOnError: false});
  }
}

document$.subscribe(renderMath);   // mkdocs-material's "page is ready", also after navigation

// Command chart draws an SVG bar chart of one column of the summary that
// bench/http.sh writes when SUMMARY names a file: each site's figure
// relative to plain, for plain, the memory zone, the Redis zone without
// and with leases, and the refusing sites, with a line at 1.0.
//
//	SUMMARY=/tmp/http.tsv bench/http.sh 8 4
//	cd bench && go run ./chart -in /tmp/http.tsv -out ../docs/near-cache-chart.svg
//
// -column picks the figure: rps_ratio_rounds (default: requests/s, the
// median of the per-round ratios to plain), rps_ratio (ratio of the
// medians), cpu_ratio_rounds or cpu_ratio_base (CPU per request, plain's
// over the site's; _base against the mean of plain and same).
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// bar is one site drawn: its name in the summary and its caption.
type bar struct {
	site, label string
}

var bars = []bar{
	{"plain", "no rate_limit"},
	{"allow", "memory zone"},
	{"redis_plain", "Redis zone"},
	{"redis_lease", "Redis + leases"},
	{"deny", "memory, refusing"},
	{"redis_deny", "Redis, refusing"},
}

// columnTitles are the y-axis labels of the columns worth drawing.
var columnTitles = map[string]string{
	"rps_ratio_rounds": "requests/s relative to plain (median of rounds)",
	"rps_ratio":        "requests/s relative to plain (ratio of medians)",
	"cpu_ratio_rounds": "plain's CPU per request / the site's",
	"cpu_ratio_base":   "CPU per request: (plain+same)/2 / the site's",
}

func main() {
	in := flag.String("in", "", "the TSV bench/http.sh wrote (SUMMARY); stdin when empty")
	out := flag.String("out", "", "the SVG to write; stdout when empty")
	column := flag.String("column", "rps_ratio_rounds", "the summary column to draw")
	title := flag.String("title", "Floodgate: a near cache in front of Redis, through Caddy", "the chart's title")
	note := flag.String("note", "", "a line under the title, such as the command and the machine")
	flag.Parse()
	if err := run(*in, *out, *column, *title, *note); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

func run(in, out, column, title, note string) error {
	yTitle, ok := columnTitles[column]
	if !ok {
		return fmt.Errorf("unknown column %q", column)
	}
	var r io.Reader = os.Stdin
	if in != "" {
		f, err := os.Open(in)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	values, err := readColumn(r, column)
	if err != nil {
		return err
	}
	vals := make([]float64, len(bars))
	for i, b := range bars {
		v, ok := values[b.site]
		if !ok {
			return fmt.Errorf("no %q site in the summary", b.site)
		}
		vals[i] = v
	}
	svg := draw(vals, title, note, yTitle)
	if out == "" {
		_, err = io.WriteString(os.Stdout, svg)
		return err
	}
	return os.WriteFile(out, []byte(svg), 0o644)
}

// readColumn reads the TSV's header and returns column's value per site.
func readColumn(r io.Reader, column string) (map[string]float64, error) {
	sc := bufio.NewScanner(r)
	if !sc.Scan() {
		return nil, errors.New("empty summary")
	}
	idx := -1
	for i, name := range strings.Split(sc.Text(), "\t") {
		if name == column {
			idx = i
		}
	}
	if idx < 1 {
		return nil, fmt.Errorf("no column %q in the summary's header", column)
	}
	values := make(map[string]float64)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), "\t")
		if len(fields) <= idx {
			return nil, fmt.Errorf("short line %q", sc.Text())
		}
		v, err := strconv.ParseFloat(fields[idx], 64)
		if err != nil {
			return nil, fmt.Errorf("site %s: %w", fields[0], err)
		}
		values[fields[0]] = v
	}
	return values, sc.Err()
}

// draw lays out the chart: a y axis from 0 to the next 0.2 above the
// largest value (at least 1.2), one bar per site with its value above it,
// and a dashed line at 1.0.
func draw(vals []float64, title, note, yTitle string) string {
	const (
		width, height     = 760, 440
		left, right       = 80, 20
		top, bottom       = 70, 80
		plotW, plotH      = width - left - right, height - top - bottom
		slot              = plotW / 6
		barW              = slot * 3 / 5
		ticks             = 0.2
		fontSans          = `font-family="sans-serif"`
		colourPlain       = "#9e9e9e"
		colourMemory      = "#4e79a7"
		colourRedis       = "#f28e2b"
		colourRedisLeased = "#59a14f"
	)
	top_ := 1.2
	for _, v := range vals {
		top_ = max(top_, math.Ceil(v/ticks+0.5)*ticks)
	}
	y := func(v float64) float64 { return top + plotH - v/top_*plotH }
	colours := []string{colourPlain, colourMemory, colourRedis, colourRedisLeased, colourMemory, colourRedis}

	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", width, height, width, height)
	fmt.Fprintf(&s, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&s, `<text x="%d" y="28" %s font-size="18" font-weight="bold" text-anchor="middle">%s</text>`+"\n", width/2, fontSans, html.EscapeString(title))
	if note != "" {
		fmt.Fprintf(&s, `<text x="%d" y="50" %s font-size="12" fill="#555" text-anchor="middle">%s</text>`+"\n", width/2, fontSans, html.EscapeString(note))
	}
	// Grid and y-axis labels.
	for i := 0; float64(i)*ticks <= top_+1e-9; i++ {
		v := float64(i) * ticks
		fmt.Fprintf(&s, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e0e0e0"/>`+"\n", left, left+plotW, y(v), y(v))
		fmt.Fprintf(&s, `<text x="%d" y="%.1f" %s font-size="12" text-anchor="end">%.1f</text>`+"\n", left-8, y(v)+4, fontSans, v)
	}
	fmt.Fprintf(&s, `<text transform="translate(22 %d) rotate(-90)" %s font-size="13" text-anchor="middle">%s</text>`+"\n", top+plotH/2, fontSans, html.EscapeString(yTitle))
	// Bars, values and site captions.
	for i, v := range vals {
		x := left + i*slot + (slot-barW)/2
		fmt.Fprintf(&s, `<rect x="%d" y="%.1f" width="%d" height="%.1f" fill="%s"/>`+"\n", x, y(v), barW, y(0)-y(v), colours[i])
		fmt.Fprintf(&s, `<text x="%d" y="%.1f" %s font-size="13" font-weight="bold" text-anchor="middle">%.2f</text>`+"\n", x+barW/2, y(v)-6, fontSans, v)
		fmt.Fprintf(&s, `<text x="%d" y="%d" %s font-size="12" text-anchor="middle">%s</text>`+"\n", x+barW/2, top+plotH+18, fontSans, html.EscapeString(bars[i].label))
		fmt.Fprintf(&s, `<text x="%d" y="%d" %s font-size="11" fill="#555" text-anchor="middle">%s</text>`+"\n", x+barW/2, top+plotH+34, fontSans, html.EscapeString(bars[i].site))
	}
	// Axes, then the line at 1.0 over the bars.
	fmt.Fprintf(&s, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, left+plotW, y(0), y(0))
	fmt.Fprintf(&s, `<line x1="%d" x2="%d" y1="%d" y2="%.1f" stroke="black"/>`+"\n", left, left, top, y(0))
	fmt.Fprintf(&s, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#c00" stroke-width="1.5" stroke-dasharray="6 4"/>`+"\n", left, left+plotW, y(1), y(1))
	// Its key, above the plot's top right corner, where no bar reaches.
	fmt.Fprintf(&s, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#c00" stroke-width="1.5" stroke-dasharray="6 4"/>`+"\n", left+plotW-110, left+plotW-80, top-8, top-8)
	fmt.Fprintf(&s, `<text x="%d" y="%d" %s font-size="11" fill="#c00">plain = 1.0</text>`+"\n", left+plotW-74, top-4, fontSans)
	fmt.Fprintf(&s, `<text x="%d" y="%d" %s font-size="13" text-anchor="middle">site (zone)</text>`+"\n", left+plotW/2, height-14, fontSans)
	s.WriteString("</svg>\n")
	return s.String()
}

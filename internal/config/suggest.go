package config

import "strings"

// suggestion returns `; did you mean "X"?` for the candidate closest to
// got, or "" when none is close.
func suggestion(got string, candidates []string) string {
	if c := closest(got, candidates); c != "" {
		return `; did you mean "` + c + `"?`
	}
	return ""
}

// closest returns the candidate nearest to got, ignoring case, or "" when
// none is close enough to be a plausible typo: a typo changes a few
// characters, so the allowed distance grows with the length of the word.
func closest(got string, candidates []string) string {
	best, bestDist := "", -1
	for _, c := range candidates {
		d := editDistance(strings.ToLower(got), strings.ToLower(c))
		if bestDist < 0 || d < bestDist {
			best, bestDist = c, d
		}
	}
	if bestDist < 0 || bestDist > max(1, len(got)/3) {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and transpositions of adjacent bytes
// each cost 1, so "comamnd" is one edit from "command".
func editDistance(a, b string) int {
	// rows[i] holds distances for a[:i]; only three rows are ever needed.
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

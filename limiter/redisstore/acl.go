package redisstore

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// scriptDenial matches the error reply by which Redis 7.0 refuses a command
// an ACL user may not run, called from a script: it names the script's SHA1
// and the line, not the command ("ERR The user executing the script can't
// run this command or subcommand script: <sha>, on @user_script:<line>.").
// Valkey and later Redis name the command themselves ("... no permissions
// to run the 'pexpire' command ...").
var scriptDenial = regexp.MustCompile(`can't run this command or subcommand script: ([0-9a-f]{40}), on @user_script:(\d+)`)

// scriptCommand finds the command a line of a script calls.
var scriptCommand = regexp.MustCompile(`redis\.p?call\(\s*'([A-Za-z]+)'`)

// nameDeniedCommand adds to err, when it is Redis 7.0's refusal of a
// command inside one of the store's scripts, the command the refused line
// calls, read from the script's source, so the operator learns what the
// ACL user lacks without ACL LOG. Any other error is returned as it is;
// err stays in the chain either way.
func (r *Store) nameDeniedCommand(err error) error {
	return nameScriptDenial(err, map[string]string{r.script.Hash(): r.src, r.batchScript.Hash(): r.batchSrc})
}

// nameScriptDenial is nameDeniedCommand for the scripts whose sources are
// given by their SHA1.
func nameScriptDenial(err error, sources map[string]string) error {
	m := scriptDenial.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	src, ok := sources[m[1]]
	if !ok {
		return err
	}
	line, convErr := strconv.Atoi(m[2])
	lines := strings.Split(src, "\n")
	if convErr != nil || line < 1 || line > len(lines) {
		return err
	}
	c := scriptCommand.FindStringSubmatch(lines[line-1])
	if c == nil {
		return err
	}
	cmd := strings.ToLower(c[1])
	return fmt.Errorf("%w (the script's line %d calls %s: the ACL user needs +%s)", err, line, strings.ToUpper(cmd), cmd)
}

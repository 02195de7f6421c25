// Package shell says how a command's login shell starts, so that it behaves exactly as
// `bash -lc COMMAND` does: the same profile, variables, options, line numbers, error
// messages, exit codes and signals, and a last simple command that replaces its shell.
//
// Every bash the agent starts is `bash -lc ARG` with BASH_ENV naming a hook (Hook), which
// bash reads after the login profile and before ARG. The hook puts the caller's environment
// back (a profile may reset PATH), sources the caller's own BASH_ENV, writes one byte to fd 6
// ("the profile is done": a Ctrl-C is held until then, see the session), and then:
//
//   - Native mode: ARG is the command itself, as under a real `bash -lc`. The hook waits for
//     a line on fd 7 (the agent sends it after a held Ctrl-C) and lets bash go on.
//   - Alias mode: ARG is a fixed line (AliasArg). The hook reads the process id and the
//     command from fd 4 (Request), makes the command the text of an alias that ARG names,
//     and bash then parses it as the -c string itself: its last simple command is executed
//     in the shell's place, as `bash -c` does, which no `eval` can do. A shell in alias mode
//     can therefore start before its command is known: a spare, started ahead of need.
//
// Alias mode takes a command of one line without a comment, a here-document or a trailing
// backslash (Choose): bash reads a here-document's body from its input, not from an alias,
// and a line's end inside an alias is not counted. The rest runs in native mode.
package shell

import (
	"strconv"
	"strings"
)

// Mode is how the command reaches its shell.
type Mode int

const (
	// Native: the command is bash's -c argument.
	Native Mode = iota
	// Alias: the command comes on fd 4, after the shell has started.
	Alias
)

// AliasArg is bash's -c argument in alias mode. The alias is expanded on line 1; the line
// continuation and the blank after it keep bash reading the -c string until the command's
// last line is parsed, so that the hook's clean-up (a line of its own, before the command)
// cannot end the parse early, and the command's last simple command is still the -c
// string's last (bash executes it in place of the shell).
const AliasArg = "__sandboxd \\\n "

// HookEnv is the environment entry that makes bash read the hook: fd 5 holds it.
const HookEnv = "BASH_ENV=/dev/fd/5"

// Descriptors of a bash start, besides stdio: the request (alias mode), the hook, the
// ready byte, the go line (native mode).
const (
	RequestFD = 4
	HookFD    = 5
	ReadyFD   = 6
	GoFD      = 7
)

// Choose says how command is to run: in alias mode when it is one line (trailing newlines
// aside) with no comment, no here-document and no trailing backslash, else natively. In
// alias mode, suffix says the command needs " ;" after it: a last command of one word ends
// with the token after it, which must be on the command's line for bash to number the
// command (and its "command not found") line 1.
func Choose(command string) (mode Mode, suffix bool) {
	body := strings.TrimRight(command, "\n")
	if strings.ContainsRune(body, '\n') {
		return Native, false
	}
	const (
		plain = iota
		single
		double
		ansi // $'...'
	)
	state := plain
	escaped := false
	wordStart := true
	last := byte(0)   // the last character outside quotes and escapes, blanks aside
	lastBare := false // whether last was a bare (unescaped, unquoted) character
	for i := 0; i < len(body); i++ {
		c := body[i]
		if escaped {
			escaped = false
			wordStart = false
			if state == plain && c != ' ' && c != '\t' {
				last, lastBare = c, false
			}
			continue
		}
		switch state {
		case single:
			if c == '\'' {
				state = plain
			}
			continue
		case double, ansi:
			if c == '\\' {
				escaped = true
			} else if (state == double && c == '"') || (state == ansi && c == '\'') {
				state = plain
			}
			continue
		}
		switch {
		case c == '\\':
			escaped = true
			last, lastBare = c, false
			continue
		case c == '\'':
			if i > 0 && body[i-1] == '$' {
				state = ansi
			} else {
				state = single
			}
		case c == '"':
			state = double
		case c == '#' && wordStart:
			return Native, false // a comment: it would swallow what follows the command
		case c == '<' && i+1 < len(body) && body[i+1] == '<':
			return Native, false // a here-document (or here-string): native, to be safe
		}
		wordStart = strings.IndexByte(" \t;&|()<>", c) >= 0
		if c != ' ' && c != '\t' {
			last, lastBare = c, state == plain && c != '\'' && c != '"'
		}
	}
	if escaped || state != plain {
		return Native, false // a trailing backslash, or an open quote: bash's own error
	}
	if last == 0 {
		return Alias, false // nothing to run
	}
	return Alias, !(lastBare && (last == ';' || last == '&'))
}

// Request is what the agent writes to fd 4 of a shell in alias mode: the process id (its
// marker's value), then the command's length in bytes and whether it needs the suffix, then
// the command.
func Request(processID, command string, suffix bool) []byte {
	flag := "-"
	if suffix {
		flag = ";"
	}
	head := processID + "\n" + strconv.Itoa(len(command)) + " " + flag + "\n"
	return append([]byte(head), command...)
}

// Hook is the text bash reads as BASH_ENV (fd 5) after the login profile. exports sets the
// caller's environment again; bashEnv is the caller's own BASH_ENV (nil: none), which the
// hook sources as bash would have. Only the shell the agent started runs the hook (its
// parent is the agent, agentPID); a bash that the profile starts finds the caller's BASH_ENV
// and nothing else.
func Hook(mode Mode, agentPID int, exports string, bashEnv *string) string {
	restore := `\builtin unset BASH_ENV`
	if bashEnv != nil {
		restore = "BASH_ENV=" + quote(*bashEnv)
	}
	body := hookNative
	if mode == Alias {
		body = hookAlias
	}
	return strings.NewReplacer(
		"@AGENT@", strconv.Itoa(agentPID),
		"@BASH_ENV@", restore,
		"@EXPORTS@", exports,
		"@MODE@", body,
	).Replace(hookText)
}

// The hook. It is sourced by bash itself: no command in it forks (a Ctrl-C that comes while
// a shell waits for a child can be lost, see the session), and every builtin is reached as
// \builtin and every test is [[ ]], which no alias or function of a profile's can replace.
// It saves what the command would have seen at the start ($?, $_, whether xtrace was on)
// and gives it back last (__sbx_end), and leaves nothing of its own behind: no variable,
// function, alias, option or descriptor.
const hookText = `{ __sbx_s=$? __sbx_u=$_ __sbx_o=$- __sbx_p=${PIPESTATUS[*]}; \builtin set +x; } 2>/dev/null
if [[ $PPID == @AGENT@ ]]; then
@BASH_ENV@
@EXPORTS@
if [[ -n ${BASH_ENV-} ]]; then
  __sbx_f=${BASH_ENV//\"/\\\"}
  \builtin eval "__sbx_f=\"$__sbx_f\""
  if [[ -e $__sbx_f ]]; then \builtin . "$__sbx_f"; __sbx_s=$? __sbx_u=$_ __sbx_p=${PIPESTATUS[*]}; fi
fi
# $? is what the last command left, PIPESTATUS its last pipeline's: after an if whose test
# failed, 0 and the test's status. __sbx_end returns __sbx_s; called as an if's test (__sbx_i)
# it gives that pair back.
if [[ $__sbx_s == 0 && $__sbx_p != 0 && $__sbx_p != *' '* ]]; then __sbx_s=$__sbx_p __sbx_i=1; fi
__sbx_end() {
  \builtin unset -f __sbx_end
  if [[ -n ${__sbx_a-} ]]; then \builtin unalias __sandboxd; \builtin shopt "$__sbx_a" expand_aliases; fi
  \builtin set -- "$__sbx_s" "$__sbx_o"
  \builtin unset __sbx_s __sbx_u __sbx_o __sbx_p __sbx_i __sbx_a __sbx_n __sbx_x __sbx_c __sbx_f
  if [[ $2 == *x* ]]; then \builtin set -x; else \builtin return "$1"; fi
}
\builtin printf R >&6
@MODE@
else
@BASH_ENV@
\builtin unset __sbx_s __sbx_u __sbx_p
if [[ -n ${BASH_ENV-} ]]; then
  __sbx_f=${BASH_ENV//\"/\\\"}
  \builtin eval "__sbx_f=\"$__sbx_f\""
  if [[ -e $__sbx_f ]]; then \builtin . "$__sbx_f"; fi
  \builtin unset __sbx_f
fi
[[ $__sbx_o != *x* ]] || \builtin set -x
\builtin unset __sbx_o
fi
`

// hookEnd is the hook's last command (native mode) or its alias's first line (alias mode):
// it leaves $?, $_ and PIPESTATUS as the profile left them.
const hookEnd = `if [[ -z ${__sbx_i-} ]]; then __sbx_end "$__sbx_u"; elif __sbx_end "$__sbx_u"; then :; fi`

// Native mode: wait for the go line (the agent's, after a held Ctrl-C), close what is the
// agent's, and let bash run its -c argument.
const hookNative = `\builtin read -r __sbx_n <&7
exec 5<&- 6>&- 7<&-
` + hookEnd

// Alias mode: read the request; a command bash cannot parse is parsed again by a bash of its
// own with -n (which reports the error exactly as a -c string's, and runs nothing), and the
// shell exits 2 as bash does after a syntax error (its EXIT trap runs); else the command
// becomes the alias AliasArg names, behind one line that undoes the hook's own traces.
var hookAlias = `\builtin read -r SANDBOXD_PROCESS_ID <&4 || \builtin exit 0
\builtin read -r __sbx_n __sbx_x <&4
LC_ALL=C \builtin read -r -N "$__sbx_n" __sbx_c <&4
exec 4<&- 5<&- 6>&-
BASH_EXECUTION_STRING=$__sbx_c
__sbx_c=${__sbx_c%"${__sbx_c##*[!$'\n']}"}
if [[ $__sbx_x == ';' ]]; then __sbx_x=' ;'; else __sbx_x=; fi
if ! \builtin eval "__sbx_chk() {
$__sbx_c$__sbx_x
}" 2>/dev/null; then
  __sbx_x=
  if ! \builtin eval "__sbx_chk() {
$__sbx_c
}" 2>/dev/null; then
    (\builtin unset BASH_ENV; exec -a bash "$BASH" -n -c "$BASH_EXECUTION_STRING")
    \builtin exit 2
  fi
fi
\builtin unset -f __sbx_chk
if \builtin shopt -q expand_aliases; then __sbx_a=-s; else __sbx_a=-u; fi
\builtin shopt -s expand_aliases
\builtin alias __sandboxd="` + hookEndQuoted + `
$__sbx_c$__sbx_x"`

// hookEndQuoted is hookEnd inside the double quotes of the alias's definition.
var hookEndQuoted = strings.NewReplacer(`"`, `\"`, `$`, `\$`).Replace(hookEnd)

// quote is s as one word of the shell's.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Exports sets the daemon's environment entries again, in the shell's own syntax: a login
// profile may have reset them (Debian's sets PATH). Names that are not shell variables, and
// skip (the agent's marker), are left to the environment alone.
func Exports(env [][2]string, skip string) string {
	var text strings.Builder
	for _, pair := range env {
		if !isIdentifier(pair[0]) || pair[0] == skip || pair[0] == "BASH_ENV" {
			continue
		}
		// 2>/dev/null: a name the shell keeps read-only (UID) stays as the shell has it.
		text.WriteString("export " + pair[0] + "=" + quote(pair[1]) + " 2>/dev/null\n")
	}
	return text.String()
}

func isIdentifier(name string) bool {
	for i, c := range name {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return name != ""
}

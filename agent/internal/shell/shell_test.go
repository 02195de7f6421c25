package shell

import "testing"

func TestChoose(t *testing.T) {
	cases := []struct {
		command string
		mode    Mode
		suffix  bool
	}{
		{"ls", Alias, true},
		{"ls -la /tmp", Alias, true},
		{"ls\n\n", Alias, true},
		{"", Alias, false},
		{"   ", Alias, false},
		{"sleep 1 &", Alias, false},
		{"echo a;", Alias, false},
		{"echo a ; ", Alias, false},
		{`find . -exec rm {} \;`, Alias, true},
		{`echo ';'`, Alias, true},
		{`echo "a;"`, Alias, true},
		{"echo a && echo b", Alias, true},
		{"echo $# ${#x} a#b", Alias, true},
		{`echo "# not a comment" '#' \#`, Alias, true},
		{"echo a # comment", Native, false},
		{"# only a comment", Native, false},
		{"ls;#x", Native, false},
		{"echo a\necho b", Native, false},
		{"cat <<EOF\nx\nEOF", Native, false},
		{"cat <<< word", Native, false},
		{"echo a\\", Native, false},
		{`echo "open`, Native, false},
		{`echo 'open`, Native, false},
		{`echo $'a\'b'`, Alias, true},
		{`echo "<<"`, Alias, true},
		{"echo '\n'", Native, false}, // a newline inside quotes is a second line too
	}
	for _, c := range cases {
		mode, suffix := Choose(c.command)
		if mode != c.mode || suffix != c.suffix {
			t.Errorf("Choose(%q) = %v, %v; want %v, %v", c.command, mode, suffix, c.mode, c.suffix)
		}
	}
}

func TestRequest(t *testing.T) {
	got := string(Request("p-1", "echo é", true))
	if want := "p-1\n7 ;\necho é"; got != want {
		t.Errorf("Request = %q, want %q", got, want)
	}
}

func TestExports(t *testing.T) {
	got := Exports([][2]string{{"PATH", "/x"}, {"A", "it's"}, {"1BAD", "x"}, {"SANDBOXD_PROCESS_ID", "p"}, {"BASH_ENV", "/e"}}, "SANDBOXD_PROCESS_ID")
	want := "export PATH='/x' 2>/dev/null\nexport A='it'\\''s' 2>/dev/null\n"
	if got != want {
		t.Errorf("Exports = %q, want %q", got, want)
	}
}

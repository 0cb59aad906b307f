package mesh

import "errors"

// Page is the answer of a paged List call (admin.proto, Paging): its items
// and the token of the page after it, "" on the last.
type Page interface {
	GetNextPageToken() string
}

// AllPages lists every page of a paged List call: list asks for the page at
// token ("" for the first), each takes every page in order, until the last.
// The pages are not one snapshot: an item present from the first page to the
// last comes once, others may or may not. list is where to retry (admin/client.Do).
func AllPages[P Page](list func(token string) (P, error), each func(P)) error {
	for token := ""; ; {
		p, err := list(token)
		if err != nil {
			return err
		}
		each(p)
		next := p.GetNextPageToken()
		switch next {
		case "":
			return nil
		case token:
			// A server that answers the token it was given would be asked
			// the same page for ever.
			return errors.New("list: the next page's token is this page's")
		}
		token = next
	}
}
